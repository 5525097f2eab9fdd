// Opens a LoRA adapter, validates it against its base model, merges it into a copy of the base and
// exports it as a PEFT adapter folder.
//
//     mcs -r:PeftC.dll Example.cs && mono Example.exe BASE_DIR ADAPTER_DIR OUT_DIR
//
// writes OUT_DIR/merged (the merged model) and OUT_DIR/adapter (the exported adapter).
using System;
using System.IO;
using PeftC;

public static class Example
{
    public static int Main(string[] args)
    {
        if (args.Length != 3)
        {
            Console.Error.WriteLine("usage: mono Example.exe BASE_DIR ADAPTER_DIR OUT_DIR");
            return 2;
        }
        string baseDir = args[0], adapterDir = args[1], outDir = args[2];
        try
        {
            // Open the adapter and check every module against the base model's weights.
            using (Adapter adapter = Adapter.Open(adapterDir))
            {
                adapter.Validate(baseDir);
                Console.WriteLine("{0}: r={1} lora_alpha={2} {3} modules", adapterDir, adapter.R, adapter.LoraAlpha, adapter.ModuleCount);

                // Merge it into the base (streaming; the output folder appears only when complete).
                using (var options = new MergeOptions())
                {
                    options.AddAdapter(adapter, 1.0);
                    string mergedDir = Path.Combine(outDir, "merged");
                    long nextReport = 0;
                    MergeResult result = Merge.Checkpoint(baseDir, mergedDir, options, (done, total) =>
                    {
                        long percent = done * 100 / Math.Max(total, 1);
                        if (percent >= nextReport)
                        {
                            Console.Error.WriteLine("merging: {0}% of {1} bytes", percent, total);
                            nextReport = percent + 25;
                        }
                        return true;  // false would cancel the merge
                    });
                    Console.WriteLine("{0}: {1} tensors merged, {2} copied", mergedDir, result.Merged, result.Copied);
                }

                // Export the adapter as PEFT's save_pretrained writes it.
                string adapterOut = Path.Combine(outDir, "adapter");
                adapter.Export(adapterOut);
                Console.WriteLine("{0}: exported", adapterOut);
            }
            return 0;
        }
        catch (PeftException e)
        {
            Console.Error.WriteLine("Example: {0}: {1}", e.CodeName, e.Message);
            return 1;
        }
    }
}

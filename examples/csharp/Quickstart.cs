// Merges a PEFT LoRA adapter into its base model: mono Quickstart.exe BASE ADAPTER OUT
using System;
using PeftC;

static class Quickstart
{
    static void Main(string[] args)
    {
        using (var options = new MergeOptions().AddAdapterDir(args[1]))
            Console.WriteLine("merged " + Merge.Checkpoint(args[0], args[2], options).Merged + " tensors into " + args[2]);
    }
}

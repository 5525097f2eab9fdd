#!/usr/bin/env python3
"""Writes data/conversions/transformers.json from transformers' own conversion table.

transformers >= 5 renames checkpoint keys on load (and back on save) and fuses per-expert weights,
driven by one table, transformers/conversion_mapping.py. PEFT names adapter modules after the model
in memory, checkpoints keep the saved names; peft_c maps one to the other with this file. Nothing is
typed by hand: the script imports the table and walks its objects.

Output (JSON, sorted keys):
  transformers_version   the version the table came from (a test regenerates and compares)
  models                 per model type or class name, as transformers looks them up (class first):
    load                 the renames applied when loading (saved name -> in-memory name), in order
    save                 the renames applied when saving (in-memory -> saved): the reversed list of
                         each rename's reverse_transform(), as transformers' revert_weight_conversion
    fusions              the WeightConverters (data only): source patterns in concatenation order,
                         target patterns, and the operations with their arguments (dim, ...)
  composed               per model_type, per model class of its auto mappings (base model, causal LM,
                         image-text-to-text; config.json "architectures"), the renames
                         get_model_conversion_mapping composes over the class's sub-models (each step
                         with the scope transformers gives it), built on the meta device from the
                         model_type's default config
  legacy                 the load-only renames transformers appends for every model

A rename step is {"kind", "regex", "targets"[, "scope", "base_model_prefix"]}:
`regex` is the Python pattern transformers compiles (named groups g0, g1, ...); the first group that
takes part in re.search's match picks targets[i]; `\\N` in a target is group N counted from that named
group; the key's first occurrence of the matched text is replaced. peft_c evaluates the regex with its
Python-compatible engine (core/python_regex.hpp), so the pattern is copied, not translated; steps
the data cannot express (a rename class with its own code) are written as {"unsupported": class}
and reported on stderr, and peft_c does not use a chain holding one. A step with "scope" applies only to
keys under "<base_model_prefix>.<scope>." or "<scope>." (transformers' _scoped_match); kind
"PrefixChange" steps are those transformers drops when saving a model it did not load.

Usage: python scripts/gen_conversions.py [OUT]   (default data/conversions/transformers.json; "-"
for stdout). Run it with the venv of scripts/python-env.sh (the pinned transformers).
"""

from __future__ import annotations

import json
import pathlib
import re
import sys
import warnings

# The rename classes whose rename_source_key is WeightTransform's or GroupWeightRename's.
PLAIN = {"WeightRenaming", "PrefixChange"}
GROUPED = {"GroupWeightRename"}


def problem(where: str, message: str, problems: list) -> None:
    problems.append(f"{where}: {message}")


def rename_step(t, where: str, problems: list) -> dict:
    kind = type(t).__name__
    if kind not in PLAIN | GROUPED:
        problem(where, f"{kind} renames with its own code; written as unsupported", problems)
        return {"unsupported": kind}
    regex = t.compiled_sources.pattern
    groups = len(t.source_patterns)
    targets = [t.target_patterns[0]] * groups if kind in PLAIN else list(t.target_patterns)
    for target in targets:
        refs = set(re.findall(r"\\(\d+)", target))
        if kind in PLAIN and refs - {"1"}:  # WeightTransform substitutes \1 only
            problem(where, f"target {target!r} uses {sorted(refs)}; only \\1 is substituted", problems)
            return {"unsupported": kind}
    try:
        re.compile(regex)
    except re.error as error:  # never expected: transformers compiled it
        problem(where, f"regex {regex!r}: {error}", problems)
        return {"unsupported": kind}
    step = {"kind": kind, "regex": regex, "targets": targets}
    if t.scope_prefix is not None:  # scoped: the key must start with [base_model_prefix.]scope.
        step["scope"] = t.scope_prefix
        step["base_model_prefix"] = t.base_model_prefix or ""
    return step


def op_data(op) -> dict:
    data = {"op": type(op).__name__}
    for name in sorted(getattr(op, "__dict__", {})):
        value = getattr(op, name)
        if value is None or isinstance(value, (bool, int, float, str)):
            data[name] = value
        elif isinstance(value, (list, tuple)) and all(isinstance(v, (bool, int, float, str)) for v in value):
            data[name] = list(value)
        else:
            data[name] = repr(type(value).__name__)
    return data


def fusion(t) -> dict:
    return {"sources": list(t._original_source_patterns), "targets": list(t._original_target_patterns),
            "operations": [op_data(op) for op in t.operations]}


def chains(transforms, where: str, problems: list) -> dict:
    """load and save renames of a list of transforms, as transformers applies them."""
    from transformers.core_model_loading import WeightConverter, WeightRenaming

    load = [rename_step(t, f"{where} load[{i}]", problems)
            for i, t in enumerate(transforms) if isinstance(t, WeightRenaming)]
    save = []
    for i, t in enumerate(reversed(transforms)):
        if not isinstance(t, WeightRenaming):
            continue
        try:
            r = t.reverse_transform()
        except Exception as error:  # noqa: BLE001 - reported, the step is written as unsupported
            problem(f"{where} save[{i}]", f"reverse_transform: {error}", problems)
            save.append({"unsupported": type(t).__name__})
            continue
        save.append(rename_step(r, f"{where} save[{i}]", problems))
    fusions = [fusion(t) for t in transforms if isinstance(t, WeightConverter)]
    return {"load": load, "save": save, "fusions": fusions}


def composed_chains(problems: list) -> dict:
    """Per model class of the auto mappings of each model type in the table: the composed renames."""
    import torch
    import transformers
    from transformers import AutoConfig
    from transformers.conversion_mapping import _build_checkpoint_conversion_mapping, get_model_conversion_mapping
    from transformers.models.auto import configuration_auto, modeling_auto

    table = _build_checkpoint_conversion_mapping()
    mappings = [modeling_auto.MODEL_MAPPING_NAMES, modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
                modeling_auto.MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES]
    composed, failed = {}, []  # model_type -> class -> chains (several model types share a class)
    for model_type in sorted(t for t in table if t in configuration_auto.CONFIG_MAPPING_NAMES):
        try:
            config = AutoConfig.for_model(model_type)
        except Exception:  # noqa: BLE001 - listed
            failed.append(model_type)
            continue
        classes = {}
        for names in mappings:
            name = names.get(model_type)
            if not isinstance(name, str) or name in classes:
                continue
            try:
                with torch.device("meta"):
                    model = getattr(transformers, name)._from_config(config)
                transforms = get_model_conversion_mapping(model, add_legacy=False)
            except Exception:  # noqa: BLE001 - listed
                failed.append(f"{model_type}/{name}")
                continue
            if transforms:
                classes[name] = chains(transforms, f"{model_type}/{name}", problems)
        if classes:
            composed[model_type] = classes
    if failed:
        print(f"gen_conversions: {len(failed)} model types/classes could not be built on the meta device "
              f"(no composed chain): {', '.join(failed)}", file=sys.stderr)
    return composed


def generate() -> dict:
    import transformers
    from transformers.conversion_mapping import _build_checkpoint_conversion_mapping

    problems: list = []
    table = _build_checkpoint_conversion_mapping()
    models = {name: chains(list(transforms), name, problems)
              for name, transforms in sorted(table.items()) if name != "legacy"}
    legacy = chains(list(table.get("legacy", [])), "legacy", problems)["load"]
    data = {"transformers_version": transformers.__version__,
            "generated_by": "scripts/gen_conversions.py",
            "models": models, "legacy": legacy, "composed": composed_chains(problems)}
    if problems:
        print("gen_conversions: steps peft_c cannot apply (written as unsupported):\n  " + "\n  ".join(problems),
              file=sys.stderr)
    return data


def dump(data: dict) -> str:
    """JSON with one line per model (a diff names the models that changed)."""
    def compact(value) -> str:
        return json.dumps(value, sort_keys=True, separators=(",", ":"))

    parts = []
    for key in sorted(data):
        value = data[key]
        if isinstance(value, dict) and key in ("models", "composed"):
            body = ",\n".join(f"  {json.dumps(name)}: {compact(value[name])}" for name in sorted(value))
            parts.append(f" {json.dumps(key)}: {{\n{body}\n }}")
        else:
            parts.append(f" {json.dumps(key)}: {compact(value)}")
    return "{\n" + ",\n".join(parts) + "\n}\n"


def main() -> int:
    out = sys.argv[1] if len(sys.argv) > 1 else str(pathlib.Path(__file__).resolve().parent.parent /
                                                    "data" / "conversions" / "transformers.json")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        text = dump(generate())
    if out == "-":
        sys.stdout.write(text)
    else:
        pathlib.Path(out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

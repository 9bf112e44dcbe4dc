#!/usr/bin/env python3
"""mih's configs and its two hand-copied tables of behaviour-field defaults agree with Hugging
Face transformers' config classes (ctest ConfigMatchesTransformers, label golden; issue 54
item 5).

1. Every spec's export (`mih list`, `mih export`) is read back by AutoConfig.from_pretrained, and
   each field its config.json declares (nested configs with a model_type of their own, by
   dotted path) must come back unchanged from the class: a field the class renames, drops or
   recomputes is a failure naming the field, the exported value and the class's.
2. The defaults mih assumes for each behaviour field, in golden/builtin_models.py DEFAULTS and in
   harness/cases/hf_interop.cpp behaviour_fields(), are compared with transformers' own: the
   attribute of a default instance of the class, None where the class derives the value from
   other fields (head_dim, num_key_value_heads), or, for a field the class does not define,
   None (read by the modeling code with getattr/hasattr, so absent = None) or an extension of
   mih's that is off by default (None or []). The C++ table is read from its source: `mih
   inspect` warns only about the fields a SPEC's declaration leaves out (not a config.json's),
   and every registered spec declares all of them, so the binary never prints those defaults.
3. The checks fail where they must, every run: two configs whose fields the class recomputes
   (head_dim null, rope_scaling with the legacy "type"), a copy of DEFAULTS and one of the C++
   table with one value changed.

Every mismatch names the model type, the field, mih's value and transformers'.
Exit status: 0 every check held; 1 otherwise; 2 usage."""
import copy
import importlib.util
import inspect
import json
import os
import re
import shutil
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import golden_kit as kit  # noqa: E402
from golden_kit import check  # noqa: E402

_ABSENT = object()


def same(a, b):
    """JSON equality: ints equal to floats, tuples to lists, dicts key by key."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    return a == b


def config_mismatches(declared, config, model_type, prefix=""):
    """[(model_type, field, exported value, the class's value)] of a config.json's fields that the
    config object read from it does not hold unchanged."""
    out = []
    for field, value in declared.items():
        if field == "torch_dtype":  # PretrainedConfig keeps it as dtype (transformers >= 4.56)
            field_value = str(getattr(config, "dtype", _ABSENT)).replace("torch.", "")
        else:
            field_value = getattr(config, field, _ABSENT)
        path = prefix + field
        if isinstance(value, dict) and "model_type" in value and field_value is not _ABSENT \
                and hasattr(field_value, "to_dict"):
            out += config_mismatches(value, field_value, value["model_type"], path + ".")
        elif field_value is _ABSENT:
            out.append((model_type, path, value, "(dropped: no such attribute)"))
        elif not same(value, field_value):
            out.append((model_type, path, value, field_value))
    return out


def describe(mismatches):
    return "; ".join("%s.%s: mih %s, transformers %s" % (m, f, json.dumps(v), t) for m, f, v, t in mismatches)


def read_back(export_dir):
    from transformers import AutoConfig

    declared = kit.read_json(os.path.join(export_dir, "config.json"))
    return config_mismatches(declared, AutoConfig.from_pretrained(export_dir), declared.get("model_type"))


def check_exports(work, mih):
    for spec in kit.specs(mih):
        out = kit.export(mih, spec, os.path.join(work, "exports", spec))
        if out:
            mismatches = read_back(out)
            check(not mismatches, "%s: every field of its config.json comes back unchanged from transformers' %s"
                  % (spec, kit.read_json(os.path.join(out, "config.json"))["model_type"]), describe(mismatches))
    return os.path.join(work, "exports", "llama")


def recomputed_copies(work, llama):
    """Configs whose fields the class recomputes: each must be a mismatch naming the field."""
    cases = [("head_dim", None), ("rope_scaling", {"type": "linear", "factor": 2.0})]
    for field, value in cases:
        out = os.path.join(work, "recomputed-" + field)
        shutil.rmtree(out, ignore_errors=True)
        shutil.copytree(llama, out)
        path = os.path.join(out, "config.json")
        config = kit.read_json(path)
        config[field] = value
        with open(path, "w", encoding="utf-8") as f:
            json.dump(config, f)
        mismatches = read_back(out)
        check(any(f == field for _, f, _, _ in mismatches), "the read-back check fails on a config.json with %s = %s"
              % (field, json.dumps(value)), describe(mismatches) or "no mismatch")
        print("      caught: " + describe(mismatches))


def modeling_reads(config_class):
    module = config_class.__module__.replace(".configuration_", ".modeling_")
    spec = importlib.util.find_spec(module)
    return kit.fields_read_by(spec.origin) if spec else set()


def default_mismatches(table):
    """[(model_type, field, mih's default, transformers')] of a {model_type: {field: default}}
    table against transformers' config classes; and notes on the fields a class does not define."""
    from transformers import CONFIG_MAPPING

    out, notes = [], []
    for model_type, fields in sorted(table.items()):
        if model_type not in CONFIG_MAPPING:
            out.append((model_type, "*", "(a table entry)", "(no such model_type)"))
            continue
        cls = CONFIG_MAPPING[model_type]
        signature, instance, reads = inspect.signature(cls.__init__).parameters, cls(), modeling_reads(cls)
        for field, value in sorted(fields.items()):
            attr = getattr(instance, field, _ABSENT)
            if attr is not _ABSENT:
                derived = field in signature and signature[field].default is None
                if not (same(value, attr) or (value is None and derived)):
                    out.append((model_type, field, value, attr))
            elif value is None and field in reads:
                notes.append("%s.%s: no field of %s, read with getattr/hasattr: absent is None"
                             % (model_type, field, cls.__name__))
            elif value in (None, []):
                notes.append("%s.%s = %s: mih's extension, no field of %s, off by default"
                             % (model_type, field, json.dumps(value), cls.__name__))
            else:
                out.append((model_type, field, value, "(no such field in %s)" % cls.__name__))
    return out, notes


def cpp_table(source_text):
    """{model_type: {field: default}} of behaviour_fields() in hf_interop.cpp's source."""
    body = source_text.split("behaviour_fields() {", 1)[-1].split("return table;", 1)[0]
    pair = r'\{"(\w+)",\s*"((?:[^"\\]|\\.)*)"\}'
    bare = pair.replace("(", "(?:").replace("(?:?:", "(?:")
    table = {}
    for model_type, fields in re.findall(r'\{"(\w+)",\s*\{((?:\s*%s,?)+)\s*\}\}' % bare, body):
        table[model_type] = {f: json.loads(v.replace('\\"', '"')) for f, v in re.findall(pair, fields)}
    entries = len(re.findall(pair, body))
    if not table or sum(len(v) for v in table.values()) != entries:
        raise SystemExit("hf_interop.cpp: behaviour_fields() not parsed (%d of %d entries): has its form changed?"
                         % (sum(len(v) for v in table.values()), entries))
    return table


def check_tables():
    sys.path.insert(0, os.path.join(ROOT, "golden"))
    import builtin_models

    with open(os.path.join(ROOT, "harness", "cases", "hf_interop.cpp"), encoding="utf-8") as f:
        source = f.read()
    tables = {"golden/builtin_models.py DEFAULTS": builtin_models.DEFAULTS,
              "hf_interop.cpp behaviour_fields()": cpp_table(source)}
    for name, table in tables.items():
        mismatches, notes = default_mismatches(table)
        check(not mismatches, "%s (%s) agrees with transformers' config classes"
              % (name, ", ".join("%s: %d fields" % (m, len(f)) for m, f in sorted(table.items()))),
              describe(mismatches))
        for n in notes:
            print("      note: " + n)
    return builtin_models.DEFAULTS, source


def check_tables_can_fail(defaults, source):
    scratch = copy.deepcopy(defaults)
    scratch["llama"]["rms_norm_eps"] = 1e-5
    mismatches, _ = default_mismatches(scratch)
    check([(m, f) for m, f, _, _ in mismatches] == [("llama", "rms_norm_eps")],
          "a copy of DEFAULTS with llama's rms_norm_eps 1e-5 fails, naming it", describe(mismatches))
    print("      caught: " + describe(mismatches))
    changed = re.sub(r'(\{"mixtral",\s*\{\{"rope_theta", )"1000000.0"', r'\1"10000.0"', source)
    mismatches, _ = default_mismatches(cpp_table(changed))
    check(changed != source and [(m, f) for m, f, _, _ in mismatches] == [("mixtral", "rope_theta")],
          "a copy of the C++ table with mixtral's rope_theta 1e4 fails, naming it", describe(mismatches))
    print("      caught: " + describe(mismatches))


def main():
    a = kit.parse_args(__doc__)
    kit.run_under(a.python)
    import transformers

    transformers.logging.set_verbosity_error()
    print("transformers %s, %s" % (transformers.__version__, sys.executable))
    work = kit.fresh_dir(a.work)
    llama = check_exports(work, a.mih)
    if os.path.isdir(llama):
        recomputed_copies(work, llama)
    defaults, source = check_tables()
    check_tables_can_fail(defaults, source)
    return kit.finish()


if __name__ == "__main__":
    sys.exit(main())

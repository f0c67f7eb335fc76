"""Builds the loop's conversations from real text nobody here wrote: Debian package
descriptions (bookworm main's Translation-en, written by Debian maintainers and upstream
authors) and the docstrings of Python's standard library. Each record is one user turn
asking about one package or one function; the target model writes the answer.

Usage: python3 make_data.py TRANSLATION_EN OUTDIR [--train 10000] [--heldout 500] [--seed 0]
Writes OUTDIR/train.chats.jsonl and OUTDIR/heldout.chats.jsonl: {"id", "messages",
"add_generation_prompt": true, "source"} per line (hsx chat-template's input)."""
import argparse
import importlib
import inspect
import json
import pkgutil
import random
import re
import sys
import warnings

DEBIAN_TEMPLATES = [
    "What is the Debian package {pkg} used for? Its description reads:\n\n{long}",
    "Explain in simple terms what this software does.\n\n{short}\n\n{long}",
    "I found a package called {pkg}, described as \"{short}\". When would I want to install it?",
    "Summarize the following package description in two sentences:\n\n{long}",
    "Write a short introduction to {pkg} ({short}) for a new Linux user.",
    "What are the main features of {pkg}? Here is what its maintainers say:\n\n{long}",
    "Based on this description, who is the intended audience of {pkg}?\n\n{long}",
    "Suggest three questions a user might ask before installing {pkg}, a package described as: {short}.",
]
PYTHON_TEMPLATES = [
    "Explain what the Python function `{name}` from the `{module}` module does, based on its documentation:\n\n{doc}",
    "Give a short example of how to use `{module}.{name}`. Its docstring says:\n\n{doc}",
    "Rewrite this Python docstring in plain English for a beginner:\n\n{doc}",
    "What does `{module}.{name}` return, and what are its parameters? Documentation:\n\n{doc}",
]


def debian_records(path):
    """(package, short description, long description) for each distinct description."""
    seen = set()
    with open(path, encoding="utf-8", errors="replace") as f:
        for block in f.read().split("\n\n"):
            fields = {}
            current = None
            for line in block.split("\n"):
                if line.startswith(" ") and current:
                    fields[current] += "\n" + line[1:]
                elif ":" in line:
                    current, _, value = line.partition(":")
                    fields[current] = value.strip()
            if "Package" not in fields or "Description-en" not in fields:
                continue
            md5 = fields.get("Description-md5")
            if md5 in seen:
                continue
            seen.add(md5)
            short, _, body = fields["Description-en"].partition("\n")
            paragraphs = [p.strip() for p in body.replace("\n.\n", "\n\n").split("\n\n")]
            long = "\n\n".join(" ".join(p.split()) for p in paragraphs if p and p != ".")
            if len(long) < 120:  # too little text to ask about
                continue
            yield fields["Package"], short.strip(), long[:1200]


def python_records():
    """(module, qualified name, docstring) for the standard library's documented functions."""
    warnings.simplefilter("ignore")
    seen = set()
    names = sorted(m.name for m in pkgutil.iter_modules() if not m.name.startswith("_"))
    stdlib = set(sys.stdlib_module_names)
    for module_name in names:
        if module_name not in stdlib or module_name in {"antigravity", "this", "idlelib", "turtledemo", "tkinter"}:
            continue
        try:
            module = importlib.import_module(module_name)
        except Exception:  # noqa: BLE001 - platform modules that do not import here
            continue
        for name, obj in sorted(vars(module).items()):
            if name.startswith("_") or not (inspect.isfunction(obj) or inspect.isbuiltin(obj) or inspect.isclass(obj)):
                continue
            doc = inspect.getdoc(obj)
            if not doc or len(doc) < 120 or doc in seen:
                continue
            seen.add(doc)
            yield module_name, name, re.sub(r"\n{3,}", "\n\n", doc)[:1200]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("translation_en")
    ap.add_argument("outdir")
    ap.add_argument("--train", type=int, default=10000)
    ap.add_argument("--heldout", type=int, default=500)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    records = []
    for pkg, short, long in debian_records(a.translation_en):
        t = rng.choice(DEBIAN_TEMPLATES)
        records.append(("debian", t.format(pkg=pkg, short=short, long=long)))
    debian = len(records)
    for module, name, doc in python_records():
        t = rng.choice(PYTHON_TEMPLATES)
        records.append(("python", t.format(module=module, name=name, doc=doc)))
    print(f"{debian} Debian descriptions, {len(records) - debian} Python docstrings", file=sys.stderr)
    rng.shuffle(records)
    total = a.train + a.heldout
    if len(records) < total:
        sys.exit(f"only {len(records)} records, {total} wanted")
    for split, rows in (("heldout", records[:a.heldout]), ("train", records[a.heldout:total])):
        with open(f"{a.outdir}/{split}.chats.jsonl", "w") as f:
            for i, (source, text) in enumerate(rows):
                f.write(json.dumps({"id": f"{split}_{i}", "source": source, "add_generation_prompt": True,
                                    "messages": [{"role": "user", "content": text}]}) + "\n")


if __name__ == "__main__":
    main()

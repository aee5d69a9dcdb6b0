#!/usr/bin/env python3
"""A natural-text corpus from this machine's English manual pages, offline.

The mixed-precision numerics compare bf16 and f32 training step by step. The
offline corpus (`--data offline`) comes from a small grammar, and its loss
falls in sudden drops whose timing any perturbation moves, so no two runs on
it agree within 2% at every step, f32 against f32 included. TinyStories, the
reference corpus, cannot be downloaded here. Manual pages are English prose
and reference text that is on every Linux machine, and a model's loss on them
falls smoothly; this script turns them into the two files `--data
text:TRAIN,VALID` reads:

    bench/man_corpus.py /tmp/mancorpus        # train.txt (12 MB), valid.txt
    mlx-llama train --data text:/tmp/mancorpus/train.txt,/tmp/mancorpus/valid.txt ...

Pages of sections 1, 2, 3, 5, 7 and 8 under /usr/share/man (English only),
stripped of roff requests and escapes (the text of heading and font macros is
kept), are shuffled with a fixed seed; one in fifty goes to validation. The
Google Cloud SDK's generated reference pages (about 19,000 near-identical
pages where it is installed) are left out, or they would be most of the
sample. Training text stops at the first page past --max-chars. The corpus
depends on which packages a machine has installed: compare runs on one
machine's corpus.
"""

import argparse
import gzip
import os
import random
import re

SECTIONS = ("man1", "man2", "man3", "man5", "man7", "man8")

# Font changes, sizes, strings, named characters and zero-width escapes.
ESCAPES = re.compile(
    r"\\f(\[[^\]]*\]|\(..|.)|\\s[+-]?\d|\\\*(\(..|\[[^\]]*\]|.)|\\\((..)|\\\[[^\]]*\]|\\[&|^%:c]|\\e"
)
# Macros whose arguments are text: headings, fonts, paragraph tags.
TEXT_MACRO = re.compile(r"[.'](SH|SS|B|I|BR|IR|RB|RI|BI|IB|IP|TP|Nm|Nd|Sh)\s+(.*)")


def plain_text(roff):
    """The readable lines of a roff page, one per source line, none empty."""
    out = []
    for line in roff.splitlines():
        if line.startswith(('.\\"', "'\\\"", '\\"')):
            continue
        if line.startswith((".", "'")):
            macro = TEXT_MACRO.match(line)
            if not macro:
                continue
            line = macro.group(2).replace('"', "")
        line = ESCAPES.sub("", line)
        line = line.replace("\\-", "-").replace("\\ ", " ").replace("\\\\", "\\").replace("\\.", ".")
        line = line.strip()
        if line:
            out.append(line)
    return "\n".join(out)


def pages(root):
    """The plain text of every page over 200 characters, in a fixed order."""
    docs = []
    for section in SECTIONS:
        folder = os.path.join(root, section)
        if not os.path.isdir(folder):
            continue
        for name in sorted(os.listdir(folder)):
            if not name.endswith(".gz"):
                continue
            try:
                roff = gzip.open(os.path.join(folder, name)).read().decode("utf-8", "replace")
            except (OSError, EOFError):
                continue
            if roff.startswith(".so "):  # a link to another page
                continue
            text = plain_text(roff)
            if len(text) > 200:
                docs.append(text)
    return docs


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", help="folder for train.txt and valid.txt")
    parser.add_argument("--man", default="/usr/share/man", help="manual pages' root")
    parser.add_argument("--max-chars", type=int, default=12_000_000, help="training text's size")
    args = parser.parse_args()
    docs = pages(args.man)
    if not docs:
        raise SystemExit(f"no manual pages under {args.man} (sections {', '.join(SECTIONS)})")
    random.Random(0).shuffle(docs)
    split = max(1, len(docs) // 50)

    def kept(d):
        return "gcloud" not in d[:200]

    valid = [d for d in docs[:split] if kept(d)]
    train, size = [], 0
    for d in docs[split:]:
        if not kept(d):
            continue
        train.append(d)
        size += len(d)
        if size > args.max_chars:
            break
    os.makedirs(args.out, exist_ok=True)
    for name, part in (("train.txt", train), ("valid.txt", valid)):
        with open(os.path.join(args.out, name), "w") as f:
            f.write("\n\n".join(part))
    print(f"{args.out}: {len(train)} training pages ({size:,} characters), {len(valid)} validation pages")


if __name__ == "__main__":
    main()

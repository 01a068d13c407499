"""Tiny Shakespeare (or your own UTF-8 text), character level -> train.bin, val.bin (np.uint16), meta.json.

The vocabulary is the text's distinct characters, sorted (65 for Tiny Shakespeare); the first 90% of the
characters are train, the rest val. The text comes from --input, else <out_dir>/input.txt, else it is downloaded.

    python data/shakespeare_char/prepare.py [--input my.txt] [--out_dir DIR]
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root: machinery/tokenizer.py and data/common.py

from data.common import run_prepare
from machinery.tokenizer import CharTokenizer

if __name__ == "__main__":
    sys.exit(run_prepare(None, description=__doc__, script_file=__file__, make_tokenizer=CharTokenizer.from_text))

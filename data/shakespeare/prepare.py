"""Tiny Shakespeare (or your own UTF-8 text) with GPT-2's BPE -> train.bin, val.bin (np.uint16), meta.json.

As nanoGPT does: the text is split at 90% of its characters, then each part is encoded with tiktoken's
encode_ordinary. The encoding is r50k_base, which has exactly the ranks, the split pattern and the
<|endoftext|> token of tiktoken's "gpt2" encoding (vocab size 50257; padding it to 50304 is a model choice,
not the data's).
Offline, tiktoken reads the ranks file from TIKTOKEN_CACHE_DIR.

    python data/shakespeare/prepare.py [--input my.txt] [--out_dir DIR]
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root: machinery/tokenizer.py and data/common.py

from data.common import run_prepare
from machinery.tokenizer import TiktokenTokenizer

if __name__ == "__main__":
    sys.exit(
        run_prepare(None, description=__doc__, script_file=__file__, make_tokenizer=lambda text: TiktokenTokenizer())
    )

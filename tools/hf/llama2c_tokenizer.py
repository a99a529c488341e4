"""llama2.c's tokenizer (tokenizer.bin / tok512.bin) in pure Python.

Hugging Face tokenizers cannot read this format, so the HF conversion of a
llama2.c model (tools/hf/convert_llama2c.py) comes with this reader. The file
is: int32 max_token_length, then per token float32 score, int32 length and
the token's bytes. Encode is llama2.c's (and tools/llama2c_model.h's
Llama2cTokenizer::Encode): optional BOS, a dummy-prefix space, UTF-8 code
points (or byte fallback, byte + 3), then greedy merges of the best-scoring
adjacent pair (the first one on ties). Decode is run.c's: a leading space is
dropped after BOS, "<0xHH>" pieces become raw bytes.

Standard library only. A loaded Tokenizer is immutable and may be shared by
threads.
"""

import math
import struct

BOS = 1
EOS = 2


class Tokenizer:
    def __init__(self, path, vocab_size):
        with open(path, "rb") as f:
            data = f.read()
        pos = 4  # max_token_length is not needed
        self.vocab, self.scores = [], []
        for i in range(vocab_size):
            if pos + 8 > len(data):
                raise ValueError(f"{path}: token {i}: truncated")
            score, n = struct.unpack_from("<fi", data, pos)
            pos += 8
            if n < 0 or pos + n > len(data):
                raise ValueError(f"{path}: token {i}: length {n} is out of bounds")
            self.vocab.append(data[pos:pos + n])
            self.scores.append(score)
            pos += n
        self.ids = {}
        for i, piece in enumerate(self.vocab):
            self.ids.setdefault(piece, i)

    def _pair_score(self, a, b):
        i = self.ids.get(self.vocab[a] + self.vocab[b])
        return (-math.inf, -1) if i is None else (self.scores[i], i)

    def encode(self, text, bos=True):
        out = [BOS] if bos else []
        first = len(out)  # the dummy-prefix space takes part in merges, BOS not
        if text:
            sp = self.ids.get(b" ")
            if sp is not None:
                out.append(sp)
        for ch in text:
            b = ch.encode("utf-8")
            i = self.ids.get(b)
            if i is not None:
                out.append(i)
            else:
                out.extend(x + 3 for x in b)
        seq = out[first:]
        pairs = [self._pair_score(seq[i], seq[i + 1]) for i in range(len(seq) - 1)]
        while pairs:
            scores = [p[0] for p in pairs]
            best = max(scores)
            if best == -math.inf:
                break
            at = scores.index(best)  # the first best pair, as llama2.c
            seq[at] = pairs[at][1]
            del seq[at + 1]
            del pairs[at]
            if at < len(pairs):
                pairs[at] = self._pair_score(seq[at], seq[at + 1])
            if at > 0:
                pairs[at - 1] = self._pair_score(seq[at - 1], seq[at])
        return out[:first] + seq

    def decode(self, tokens, prev=BOS):
        out = bytearray()
        for t in tokens:
            piece = self.vocab[t]
            if prev == BOS and piece.startswith(b" "):
                piece = piece[1:]
            if len(piece) == 6 and piece.startswith(b"<0x") and piece.endswith(b">"):
                try:
                    piece = bytes([int(piece[3:5], 16)])
                except ValueError:
                    pass
            out += piece
            prev = t
        return out.decode("utf-8", "replace")


def load_stories(path):
    """The stories of a TinyStories text file (validation_100.txt), split at
    "<|endoftext|>", stripped, empty ones left out."""
    with open(path, encoding="utf-8") as f:
        return [s.strip() for s in f.read().split("<|endoftext|>") if s.strip()]

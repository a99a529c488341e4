"""tools/hf: the llama2.c -> Hugging Face Llama conversion, checked without
transformers against the C++ reference model (tools/llama2c_model.h).

The converted folder is read back and run by tools/hf/torch_llama.py (a
plain-torch HF-semantics Llama: half-split RoPE, GQA, RMSNorm eps 1e-5,
SwiGLU). Checks:
- greedy decoding from BOS begins "Once upon a time, there was a little girl
  named Lily." (shared/README.md);
- on two validation stories, every layer's keys (mapped back to interleaved
  order) and values equal the cache the C++ model writes
  (`kvharbor-kv-quality capture`), and the token counts equal the C++
  tokenizer's (the same split of the sequences);
- on two more stories, the teacher-forced loss equals the C++ model's
  (`kvharbor-kv-quality eval`, "uncompressed (fp32 cache) held-out loss").
  The loss is the mean over positions of -log softmax(logits)[next token],
  so it checks the logits' agreement at every position.

Needs torch (Debian's python3-torch; the test is skipped without it), the
stories260K folder (convert_llama2c.find_stories260k: $STORIES260K_DIR, else
../shared/stories260K or ../../shared/stories260K from the checkout, or from
the local checkout it was cloned from) and
KVHARBOR_KV_QUALITY (the
built kvharbor-kv-quality; CTest sets it).
"""

import os
import re
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "tools", "hf"))

import numpy as np  # noqa: E402

import convert_llama2c  # noqa: E402
import kv_samples  # noqa: E402
from llama2c_tokenizer import BOS, Tokenizer, load_stories  # noqa: E402

try:
    import torch
    from torch_llama import TorchLlama
except ImportError:
    torch = None

LILY = "Once upon a time, there was a little girl named Lily."
STORIES = (0, 1, 2, 3)  # kv_quality: the first half is captured, the rest evaluated


@unittest.skipIf(torch is None,
                 "torch is not installed (apt-get install python3-torch)")
class Llama2cHfTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.kv_quality = os.environ.get("KVHARBOR_KV_QUALITY", "")
        if not os.path.isfile(cls.kv_quality):
            raise RuntimeError("set KVHARBOR_KV_QUALITY to the built kvharbor-kv-quality")
        cls.dir = convert_llama2c.find_stories260k(REPO)
        cls.tmp = tempfile.TemporaryDirectory()
        out = os.path.join(cls.tmp.name, "hf")
        cls.weights = convert_llama2c.convert(
            os.path.join(cls.dir, "stories260K.bin"), out)
        cfg, state = convert_llama2c.load_hf_folder(out)
        cls.cfg = cfg
        cls.model = TorchLlama(cfg, state)
        cls.tok = Tokenizer(os.path.join(cls.dir, "tok512.bin"), cfg["vocab_size"])
        stories = load_stories(os.path.join(cls.dir, "validation_100.txt"))
        cls.stories = [stories[i] for i in STORIES]
        cls.text = os.path.join(cls.tmp.name, "stories.txt")
        with open(cls.text, "w", encoding="utf-8") as f:
            f.write("\n<|endoftext|>\n".join(cls.stories))

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def run_kv_quality(self, *args):
        cmd = [self.kv_quality, *args, "--model",
               os.path.join(self.dir, "stories260K.bin"), "--tokenizer",
               os.path.join(self.dir, "tok512.bin"), "--text", self.text,
               "--calib-fraction", "0.5"]
        r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True, timeout=300)
        self.assertEqual(r.returncode, 0, f"{' '.join(cmd)}:\n{r.stderr}")
        return r.stdout

    def sequence(self, story):
        """BOS + the story's tokens, cut to seq_len (as kv_quality does)."""
        return self.tok.encode(story, bos=True)[:self.cfg["max_position_embeddings"]]

    def test_config_and_weights(self):
        self.assertEqual(self.cfg["num_hidden_layers"], 5)
        self.assertEqual(self.cfg["num_key_value_heads"], 4)
        self.assertEqual(self.cfg["head_dim"], 8)
        self.assertTrue(self.cfg["tie_word_embeddings"])
        self.assertTrue(os.path.getsize(self.weights) > 0)

    def test_permutation_round_trip(self):
        _, w = convert_llama2c.read_llama2c(os.path.join(self.dir, "stories260K.bin"))
        wk = w["wk"][0]
        back = convert_llama2c.unpermute_heads(
            convert_llama2c.permute_heads(wk, 4).T, 8).T
        np.testing.assert_array_equal(back, wk)

    def test_greedy_from_bos_is_the_lily_story(self):
        cache = self.model.new_cache(64)
        logits = self.model.forward([BOS], cache)[-1]
        out = []
        for _ in range(40):
            nxt = int(torch.argmax(logits))
            out.append(nxt)
            logits = self.model.forward([nxt], cache)[-1]
        text = self.tok.decode(out)
        self.assertTrue(text.startswith(LILY), repr(text))

    def test_kv_equals_the_cpp_model(self):
        path = os.path.join(self.tmp.name, "samples.safetensors")
        self.run_kv_quality("capture", "--out", path)
        t, meta = kv_samples.read_safetensors(path)
        self.assertEqual(meta["rope_style"], "interleaved")
        starts = list(np.flatnonzero(t["positions"] == 0)) + [len(t["positions"])]
        self.assertEqual(len(starts) - 1, 2, "kv_quality captured 2 sequences")
        hd = self.cfg["head_dim"]
        for i, story in enumerate(self.stories[:2]):
            ids = self.sequence(story)
            lo, hi = starts[i], starts[i + 1]
            self.assertEqual(hi - lo, len(ids), f"story {i}: token count vs C++")
            cache = self.model.new_cache(len(ids))
            self.model.forward(ids, cache)
            for l in range(self.cfg["num_hidden_layers"]):
                # ours [1][H][T][D] half-split -> [T][H][D] interleaved
                k = convert_llama2c.unpermute_heads(
                    cache.k[l][0].transpose(0, 1).numpy(), hd)
                v = cache.v[l][0].transpose(0, 1).numpy()
                ck, cv = t["k"][lo:hi, l], t["v"][lo:hi, l]
                for name, ours, ref in (("k", k, ck), ("v", v, cv)):
                    err = np.abs(ours - ref).max() / max(np.abs(ref).max(), 1e-6)
                    self.assertLess(err, 1e-4, f"story {i} layer {l} {name}")

    def test_loss_equals_the_cpp_model(self):
        out = self.run_kv_quality("eval")
        m = re.search(r"uncompressed \(fp32 cache\) held-out loss: ([0-9.]+)", out)
        self.assertIsNotNone(m, out)
        ref = float(m.group(1))
        nll, count = 0.0, 0
        for story in self.stories[2:]:
            ids = self.sequence(story)
            cache = self.model.new_cache(len(ids))
            logits = self.model.forward(ids, cache)[:-1].double()
            target = torch.tensor(ids[1:])
            nll += float(torch.nn.functional.cross_entropy(logits, target,
                                                           reduction="sum"))
            count += len(ids) - 1
        # kv_quality prints 4 decimals.
        self.assertAlmostEqual(nll / count, ref, delta=2e-4)


if __name__ == "__main__":
    unittest.main()

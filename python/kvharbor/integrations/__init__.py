"""Engine integrations of kvharbor (they need torch; the engines themselves
are imported only when their class is first looked up):

- kvharbor.integrations.vllm: KvHarborConnector, a vLLM KV connector
  (docs/vllm.md);
- kvharbor.integrations.sglang: KvHarborStore, an SGLang HiCache storage
  backend (docs/sglang.md).

Their engine-neutral core is _engine.py (the daemon connection, misses on
failure, layer-wise loads and saves) and _paged.py (an engine's paged KV
cache as per-layer K/V views, and the page copies).
"""

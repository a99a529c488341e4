// append_bench: a multi-turn conversation stored the old way (every turn
// re-sends the whole prefix) beside append inserts (every turn sends only
// its new pages: InsertOptions::skip_pages) and layer-major appends
// (Client::BeginInsert, one layer at a time as an engine's prefill finishes
// it), in one run against one daemon.
//
// Default: the Llama-3-8B geometry (32 layers x 8 KV heads x 128, bf16,
// page 16: 2 MiB pages), 20 turns of 256 tokens each (16 pages, 32 MiB), so
// the conversation ends at 5120 tokens, 320 pages, 640 MiB. Each way runs on
// a fresh namespace of that capacity (the previous one is deleted first),
// against an in-process kvharbord on loopback (the daemon's gRPC server and
// core as kvharbord runs them), or with --addr a running kvharbord. Bytes
// sent are the daemon's bytes_in (page bytes it received), time is the wall
// time of the Insert call(s) of the turn. Ratios: old / new.
//
// The client holds the whole conversation's pages (as an engine holds its KV
// cache); the daemon the namespace's: about 1.3 GiB together at the default.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "kvharbor/client.h"
#include "server/daemon/daemon.h"
#include "types/layer_range.h"

ABSL_FLAG(uint32_t, turns, 20, "conversation turns");
ABSL_FLAG(uint32_t, tokens_per_turn, 256, "tokens each turn adds");
ABSL_FLAG(uint32_t, layers, 32, "num_layers");
ABSL_FLAG(uint32_t, kv_heads, 8, "num_kv_heads");
ABSL_FLAG(uint32_t, head_dim, 128, "head_dim");
ABSL_FLAG(uint32_t, page_size, 16, "tokens per page");
ABSL_FLAG(std::string, addr, "",
          "a running kvharbord (HOST:PORT); empty = an in-process daemon");

namespace kvharbor {
namespace {

using Clock = std::chrono::steady_clock;

struct Turn {
  uint64_t bytes = 0;  // the daemon's bytes_in for the turn
  double seconds = 0;
};

enum class Way { kResend, kAppend, kLayers };

const char* WayName(Way w) {
  switch (w) {
    case Way::kResend:
      return "resend";
    case Way::kAppend:
      return "append";
    case Way::kLayers:
      return "layers";
  }
  return "?";
}

void Die(const std::string& what, const absl::Status& s) {
  std::fprintf(stderr, "%s: %s\n", what.c_str(), s.ToString().c_str());
  std::exit(1);
}

uint64_t BytesIn(Client& c, const std::string& ns) {
  auto st = c.Stats(ns);
  if (!st.ok()) Die("Stats", st.status());
  return st->namespaces.at(0).bytes_in;
}

// Layer `l` of pages [from, to) of `pages`: for each page, K then V of the
// layer, as pieces pointing into the pages (no copy).
std::vector<absl::Span<const uint8_t>> LayerPieces(
    const Geometry& g, const std::vector<uint8_t>& pages, uint32_t from,
    uint32_t to, uint32_t l) {
  const uint64_t pb = g.PageBytes(), kvb = KvLayerBytes(g);
  std::vector<absl::Span<const uint8_t>> out;
  for (uint32_t p = from; p < to; ++p) {
    for (int kv = 0; kv < 2; ++kv) {
      out.push_back(absl::MakeConstSpan(pages).subspan(
          p * pb + KvLayerOffset(g, l, kv), kvb));
    }
  }
  return out;
}

// One turn: the conversation so far is `tokens`, its pages the first
// tokens / page_size of `pages`, of which `cached` are stored already.
absl::Status StoreTurn(Client& c, const std::string& ns, Way way,
                       const Geometry& g, absl::Span<const int32_t> tokens,
                       const std::vector<uint8_t>& pages, uint32_t cached) {
  const uint64_t pb = g.PageBytes();
  const uint32_t n = static_cast<uint32_t>(tokens.size() / g.page_size);
  std::vector<absl::Span<const uint8_t>> views;
  for (uint32_t p = 0; p < n; ++p) {
    views.push_back(absl::MakeConstSpan(pages).subspan(p * pb, pb));
  }
  client::InsertOptions options;
  switch (way) {
    case Way::kResend:
      return c.Insert(ns, tokens, views).status();
    case Way::kAppend:
      options.skip_pages = cached;
      return c.Insert(ns, client::Sequence::OfTokens(tokens), views, options)
          .status();
    case Way::kLayers: {
      options.skip_pages = cached;
      auto up = c.BeginInsert(ns, client::Sequence::OfTokens(tokens), options);
      if (!up.ok()) return up.status();
      for (uint32_t l = 0; l < g.num_layers; ++l) {
        const auto pieces = LayerPieces(g, pages, cached, n, l);
        absl::Status s = (*up)->SendLayer(l, pieces);
        if (!s.ok()) return s;
      }
      return (*up)->Commit().status();
    }
  }
  return absl::InternalError("unknown way");
}

std::vector<Turn> RunWay(Client& c, Way way, const Geometry& g,
                         const std::vector<int32_t>& tokens,
                         const std::vector<uint8_t>& pages) {
  const std::string ns = absl::StrCat("append_", WayName(way));
  const uint32_t turns = absl::GetFlag(FLAGS_turns);
  const uint32_t per_turn = absl::GetFlag(FLAGS_tokens_per_turn);
  client::NamespaceSpec spec;
  spec.name = ns;
  spec.geometry = g;
  spec.capacity_bytes = pages.size();
  auto made = c.CreateNamespace(spec);
  if (!made.ok()) Die("CreateNamespace", made.status());
  std::vector<Turn> out;
  uint32_t cached = 0;
  for (uint32_t t = 1; t <= turns; ++t) {
    const auto seq = absl::MakeConstSpan(tokens).first(size_t{t} * per_turn);
    const uint64_t before = BytesIn(c, ns);
    const Clock::time_point start = Clock::now();
    absl::Status s = StoreTurn(c, ns, way, g, seq, pages, cached);
    const double secs =
        std::chrono::duration<double>(Clock::now() - start).count();
    if (!s.ok()) Die(absl::StrCat(WayName(way), " turn ", t), s);
    out.push_back(Turn{BytesIn(c, ns) - before, secs});
    cached = static_cast<uint32_t>(seq.size() / g.page_size);
  }
  // Every page is there and whole.
  auto m = c.Match(ns, tokens, /*lock=*/true);
  if (!m.ok() || m->matched_tokens != tokens.size()) {
    Die("final Match", m.ok() ? absl::DataLossError("short") : m.status());
  }
  std::vector<uint8_t> back(pages.size());
  auto f = c.FetchInto(ns, client::FetchSource::FromLease(m->id),
                       absl::MakeSpan(back));
  if (!f.ok()) Die("final Fetch", f.status());
  if (back != pages) Die("final Fetch", absl::DataLossError("bytes differ"));
  if (absl::Status r = c.Release(m->id); !r.ok()) Die("Release", r);
  if (absl::Status d = c.DeleteNamespace(ns); !d.ok()) Die("Delete", d);
  return out;
}

int Main() {
  Geometry g;
  g.num_layers = absl::GetFlag(FLAGS_layers);
  g.num_kv_heads = absl::GetFlag(FLAGS_kv_heads);
  g.head_dim = absl::GetFlag(FLAGS_head_dim);
  g.page_size = absl::GetFlag(FLAGS_page_size);
  g.dtype = DType::kBF16;
  const uint32_t turns = absl::GetFlag(FLAGS_turns);
  const uint32_t per_turn = absl::GetFlag(FLAGS_tokens_per_turn);
  if (absl::Status v = g.Validate(); !v.ok()) Die("geometry", v);
  if (turns == 0 || per_turn == 0 || per_turn % g.page_size != 0) {
    std::fprintf(stderr,
                 "--turns > 0 and --tokens_per_turn a non-zero multiple of "
                 "--page_size\n");
    return 2;
  }
  const uint64_t total_tokens = uint64_t{turns} * per_turn;
  const uint64_t total_bytes = total_tokens / g.page_size * g.PageBytes();
  std::vector<int32_t> tokens(total_tokens);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = 1000 + i;
  std::vector<uint8_t> pages(total_bytes);
  std::mt19937_64 rng(1);
  for (size_t i = 0; i + 8 <= pages.size(); i += 8) {
    const uint64_t v = rng();
    std::memcpy(pages.data() + i, &v, 8);
  }

  std::unique_ptr<Daemon> daemon;
  ClientOptions copt;
  copt.address = absl::GetFlag(FLAGS_addr);
  copt.default_timeout = absl::Minutes(10);
  if (copt.address.empty()) {
    DaemonOptions dopt;
    dopt.listen = "127.0.0.1:0";
    dopt.store.pool_budget_bytes = total_bytes + (uint64_t{64} << 20);
    auto d = Daemon::Start(dopt);
    if (!d.ok()) Die("daemon", d.status());
    daemon = *std::move(d);
    copt.address = daemon->address();
  }
  auto c = Client::Create(copt);
  if (!c.ok()) Die("client", c.status());

  std::printf(
      "append_bench: %u turns of %u tokens, geometry %s (page %.1f MiB), "
      "daemon %s\n",
      turns, per_turn, g.DebugString().c_str(), g.PageBytes() / 1048576.0,
      daemon != nullptr ? "in-process on loopback" : copt.address.c_str());
  const std::vector<Turn> old_way = RunWay(**c, Way::kResend, g, tokens, pages);
  const std::vector<Turn> append = RunWay(**c, Way::kAppend, g, tokens, pages);
  const std::vector<Turn> layers = RunWay(**c, Way::kLayers, g, tokens, pages);
  std::printf("%4s %8s %11s %11s %11s %9s %9s %9s %10s %10s\n", "turn",
              "tokens", "resend_MiB", "append_MiB", "layers_MiB", "resend_s",
              "append_s", "layers_s", "bytes_r/a", "time_r/a");
  double sum[3] = {0, 0, 0}, secs[3] = {0, 0, 0};
  for (uint32_t t = 0; t < turns; ++t) {
    const Turn* w[3] = {&old_way[t], &append[t], &layers[t]};
    for (int i = 0; i < 3; ++i) {
      sum[i] += w[i]->bytes;
      secs[i] += w[i]->seconds;
    }
    std::printf(
        "%4u %8u %11.1f %11.1f %11.1f %9.3f %9.3f %9.3f %9.1fx %9.1fx\n", t + 1,
        (t + 1) * per_turn, w[0]->bytes / 1048576.0, w[1]->bytes / 1048576.0,
        w[2]->bytes / 1048576.0, w[0]->seconds, w[1]->seconds, w[2]->seconds,
        double(w[0]->bytes) / w[1]->bytes, w[0]->seconds / w[1]->seconds);
  }
  std::printf(
      "total: resend %.1f MiB in %.2f s, append %.1f MiB in %.2f s, layers "
      "%.1f MiB in %.2f s; resend/append: %.1fx bytes, %.1fx time; "
      "resend/layers: %.1fx bytes, %.1fx time\n",
      sum[0] / 1048576.0, secs[0], sum[1] / 1048576.0, secs[1],
      sum[2] / 1048576.0, secs[2], sum[0] / sum[1], secs[0] / secs[1],
      sum[0] / sum[2], secs[0] / secs[2]);
  return 0;
}

}  // namespace
}  // namespace kvharbor

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return kvharbor::Main();
}

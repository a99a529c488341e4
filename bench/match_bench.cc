// match_bench: in-process prefix-match throughput of RadixIndex beside a
// vLLM-style page-hash baseline, on the same cached sequences and queries.
//
// Workload: `seqs` cached sequences of `prefix` tokens forming a random tree
// (sequence i shares a page-aligned prefix of uniformly random length with an
// earlier sequence, then continues with fresh random tokens). Queries are
// every sequence in full plus every sequence cut at a random page and given a
// different tail, shuffled. Throughput counts matched tokens per second of
// this thread's CPU time (the build machines are shared, and wall time there
// mostly measures the neighbours; --wall_time switches to wall time).
//
// Baseline (what vLLM's prefix caching does): per page, h = XXH3(page tokens,
// seed = parent h); look h up in an absl::flat_hash_map<hash, page>, walking
// page by page until a miss. Its map key is already a strong hash, so it uses
// an identity hasher (the cheapest honest choice). It stores no token ids and
// trusts the 64-bit hash, as vLLM does.
//
// Floor: one memcmp per query of its matched tokens against the stored
// sequence it came from, the least any exact matcher must read (floor_Mt/s;
// r/floor is the radix index's share of that speed).
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "core/radix_index.h"
// clang-format off
#include <xxh3.h>  // XXH_INLINE_ALL
// clang-format on

ABSL_FLAG(uint32_t, page_size, 16, "tokens per page");
ABSL_FLAG(std::string, prefixes, "4096,32768", "sequence lengths (tokens)");
ABSL_FLAG(std::string, seqs, "64,256", "cached sequences per run");
ABSL_FLAG(double, min_time_s, 0.3, "minimum time per measurement");
ABSL_FLAG(int, reps, 5, "alternating measurements per side (median kept)");
ABSL_FLAG(uint64_t, seed, 1, "workload seed");
ABSL_FLAG(bool, wall_time, false, "time by wall clock instead of thread CPU");

namespace kvharbor {
namespace {

using Tokens = std::vector<Token>;

struct IdentityHash {
  size_t operator()(uint64_t h) const { return static_cast<size_t>(h); }
};

class PageHashIndex {
 public:
  explicit PageHashIndex(uint32_t page_size) : page_size_(page_size) {}

  void Add(const Tokens& tokens, const std::vector<PageHandle>& pages) {
    uint64_t h = 0;
    for (size_t i = 0; i < pages.size(); ++i) {
      h = HashPage(tokens.data() + i * page_size_, h);
      map_.emplace(h, pages[i]);
    }
  }

  size_t Match(const Tokens& tokens, std::vector<PageHandle>* pages) const {
    const size_t n = tokens.size() / page_size_;
    uint64_t h = 0;
    size_t i = 0;
    for (; i < n; ++i) {
      h = HashPage(tokens.data() + i * page_size_, h);
      auto it = map_.find(h);
      if (it == map_.end()) break;
      pages->push_back(it->second);
    }
    return i * page_size_;
  }

  size_t MemoryBytes() const {
    return map_.capacity() *
           (sizeof(std::pair<const uint64_t, PageHandle>) + 1);
  }

 private:
  uint64_t HashPage(const Token* page, uint64_t parent) const {
    return XXH3_64bits_withSeed(page, page_size_ * sizeof(Token), parent);
  }

  const uint32_t page_size_;
  absl::flat_hash_map<uint64_t, PageHandle, IdentityHash> map_;
};

struct Workload {
  std::vector<Tokens> seqs;
  std::vector<Tokens> queries;
  std::vector<size_t> origin;  // the seq each query was made from
};

Workload MakeWorkload(size_t num_seqs, size_t len, uint32_t ps,
                      std::mt19937_64& rng) {
  auto token = [&] { return static_cast<Token>(rng() % 128000); };
  Workload w;
  const size_t pages = len / ps;
  for (size_t i = 0; i < num_seqs; ++i) {
    Tokens t;
    if (i > 0) {
      const Tokens& parent = w.seqs[rng() % i];
      t.assign(parent.begin(), parent.begin() + (rng() % (pages + 1)) * ps);
    }
    while (t.size() < len) t.push_back(token());
    w.seqs.push_back(std::move(t));
  }
  std::vector<std::pair<Tokens, size_t>> made;
  for (size_t i = 0; i < w.seqs.size(); ++i) {
    const Tokens& s = w.seqs[i];
    made.emplace_back(s, i);
    Tokens cut(s.begin(), s.begin() + (rng() % pages) * ps);
    while (cut.size() < len) cut.push_back(token());
    made.emplace_back(std::move(cut), i);
  }
  std::shuffle(made.begin(), made.end(), rng);
  for (auto& [q, i] : made) {
    w.queries.push_back(std::move(q));
    w.origin.push_back(i);
  }
  return w;
}

double NowSeconds() {
  if (absl::GetFlag(FLAGS_wall_time)) {
    return std::chrono::duration<double>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

// Runs `one_pass` (returns matched tokens) until min_time; tokens/s.
template <typename F>
double Measure(F one_pass, double min_time) {
  const double start = NowSeconds();
  double tokens = 0, elapsed = 0;
  do {
    tokens += static_cast<double>(one_pass());
    elapsed = NowSeconds() - start;
  } while (elapsed < min_time);
  return tokens / elapsed;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void RunOne(size_t len, size_t num_seqs, uint32_t ps, std::mt19937_64& rng) {
  const Workload w = MakeWorkload(num_seqs, len, ps, rng);
  RadixIndex radix(ps);
  PageHashIndex hashed(ps);
  PageHandle next = 0;
  std::vector<PageHandle> pages;
  for (const Tokens& s : w.seqs) {
    std::vector<PageHandle> fresh(s.size() / ps);
    for (PageHandle& h : fresh) h = next++;
    if (!radix.Insert(s, fresh).ok()) std::abort();
    pages.clear();
    radix.Match(s, &pages);  // the handles the index kept
    hashed.Add(s, pages);
  }
  // Warm-up pass: splits settle, and both sides must agree exactly.
  std::vector<PageHandle> other;
  std::vector<size_t> matched;
  for (const Tokens& q : w.queries) {
    pages.clear();
    other.clear();
    const size_t a = radix.Match(q, &pages).matched_tokens;
    matched.push_back(a);
    const size_t b = hashed.Match(q, &other);
    if (a != b || pages != other) {
      std::fprintf(stderr, "MISMATCH: radix %zu tokens, hash %zu tokens\n", a,
                   b);
      std::exit(1);
    }
  }
  auto radix_pass = [&] {
    size_t tokens = 0;
    for (const Tokens& q : w.queries) {
      pages.clear();
      tokens += radix.Match(q, &pages).matched_tokens;
    }
    return tokens;
  };
  auto hash_pass = [&] {
    size_t tokens = 0;
    for (const Tokens& q : w.queries) {
      pages.clear();
      tokens += hashed.Match(q, &pages);
    }
    return tokens;
  };
  // The floor of any exact matcher: read the matched tokens of the query and
  // of one stored copy (the sequence the query was made from) with libc's
  // memcmp, nothing else. The radix index cannot beat it; the hash baseline
  // skips it by trusting 64-bit hashes.
  auto floor_pass = [&] {
    size_t tokens = 0;
    for (size_t i = 0; i < w.queries.size(); ++i) {
      const size_t n = matched[i];
      if (std::memcmp(w.queries[i].data(), w.seqs[w.origin[i]].data(),
                      n * sizeof(Token)) == 0) {
        tokens += n;
      }
    }
    return tokens;
  };
  std::vector<double> r, h, f;
  const double min_time = absl::GetFlag(FLAGS_min_time_s);
  for (int i = 0; i < absl::GetFlag(FLAGS_reps); ++i) {
    r.push_back(Measure(radix_pass, min_time));
    h.push_back(Measure(hash_pass, min_time));
    f.push_back(Measure(floor_pass, min_time));
  }
  const double rt = Median(r), ht = Median(h), ft = Median(f);
  const double cached = static_cast<double>(radix.total_pages()) * ps;
  const double radix_bpt = radix.MemoryBytes() / cached;
  std::printf(
      "%7zu %5zu %7zu %9.0f %6zu %11.1f %11.1f %7.1fx %10.1f %7.2f %8.2f "
      "%8.2f %8.2f\n",
      len, num_seqs, w.queries.size(), cached, radix.node_count(), rt / 1e6,
      ht / 1e6, rt / ht, ft / 1e6, rt / ft, radix_bpt,
      radix_bpt - sizeof(Token), hashed.MemoryBytes() / cached);
  std::printf(
      "  targets: radix >= 100 M tokens/s: %s; >= 5x hash: %s; <= 8 B/token "
      "beyond ids: %s\n",
      rt >= 100e6 ? "met" : "MISSED", rt >= 5 * ht ? "met" : "MISSED",
      radix_bpt - sizeof(Token) <= 8 ? "met" : "MISSED");
}

std::vector<size_t> ParseList(const std::string& s) {
  std::vector<size_t> out;
  for (absl::string_view part : absl::StrSplit(s, ',')) {
    size_t v = 0;
    if (!absl::SimpleAtoi(part, &v) || v == 0) {
      std::fprintf(stderr, "bad list element '%s'\n",
                   std::string(part).c_str());
      std::exit(2);
    }
    out.push_back(v);
  }
  return out;
}

}  // namespace
}  // namespace kvharbor

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const uint32_t ps = absl::GetFlag(FLAGS_page_size);
  if (ps == 0) {
    std::fprintf(stderr, "--page_size must be >= 1\n");
    return 2;
  }
  std::mt19937_64 rng(absl::GetFlag(FLAGS_seed));
  std::printf(
      "match_bench: page_size=%u, median of %d alternating runs of >= %.2f s "
      "(%s); Mt/s = million matched tokens per second\n",
      ps, absl::GetFlag(FLAGS_reps), absl::GetFlag(FLAGS_min_time_s),
      absl::GetFlag(FLAGS_wall_time) ? "wall time" : "thread CPU time");
  std::printf("%7s %5s %7s %9s %6s %11s %11s %8s %10s %7s %8s %8s %8s\n",
              "prefix", "seqs", "queries", "cached", "nodes", "radix_Mt/s",
              "hash_Mt/s", "ratio", "floor_Mt/s", "r/floor", "radixB/t",
              "beyondId", "hashB/t");
  for (size_t len : kvharbor::ParseList(absl::GetFlag(FLAGS_prefixes))) {
    for (size_t n : kvharbor::ParseList(absl::GetFlag(FLAGS_seqs))) {
      if (len % ps != 0 || len < ps) {
        std::fprintf(stderr, "prefix %zu is not a multiple of page_size\n",
                     len);
        return 2;
      }
      kvharbor::RunOne(len, n, ps, rng);
    }
  }
  return 0;
}

#include "core/codec/kvtc/kvtc_bit_allocation.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <random>
#include <vector>

#include "core/codec/kvtc/kvtc_format.h"

namespace kvharbor {
namespace {

std::vector<double> DecayingVariances(size_t n, double decay) {
  std::vector<double> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = 10.0 * std::pow(decay, double(i));
  return v;
}

// Bits a row costs, recomputed from the ranges alone (what the codec writes).
uint64_t RangeBits(const std::vector<KvtcRange>& ranges) {
  uint64_t bits = 0;
  for (const KvtcRange& r : ranges) {
    const uint64_t w = r.end_idx - r.start_idx;
    bits += r.quant_type == KvtcQuantType::kFp8
                ? 8 * w
                : 64 + 8 * IntXBytesPerRow(w, r.int_bits);
  }
  return bits;
}

TEST_CASE("bit allocation: cost of each choice counts metadata",
          "[kvtc_bit_allocation]") {
  CHECK(KvtcGroupCostBits(16, KvtcGroupChoice::kNone) == 0);
  CHECK(KvtcGroupCostBits(16, KvtcGroupChoice::kFp8) == 128);
  CHECK(KvtcGroupCostBits(16, KvtcGroupChoice::kInt4) == 64 + 64);
  CHECK(KvtcGroupCostBits(16, KvtcGroupChoice::kInt2) == 64 + 32);
  // Rows start on a byte: 3 values of 2 bits still take a byte.
  CHECK(KvtcGroupCostBits(3, KvtcGroupChoice::kInt2) == 64 + 8);
}

TEST_CASE("bit allocation: budget never exceeded, error never grows with it",
          "[kvtc_bit_allocation]") {
  const std::vector<double> var = DecayingVariances(64, 0.9);
  auto groups = ModelGroupErrors(var, 8);
  REQUIRE(groups.ok());
  double prev_error = std::numeric_limits<double>::infinity();
  for (uint64_t budget = 0; budget <= 64 * 8 + 64; budget += 8) {
    BitAllocationOptions opt;
    opt.budget_bits_per_row = budget;
    auto a = AllocateKvtcBits(*groups, opt);
    REQUIRE(a.ok());
    INFO("budget " << budget);
    CHECK(a->used_bits_per_row <= budget);
    // The ranges cost exactly what the DP counted (no merging of IntX).
    CHECK(RangeBits(a->ranges) == a->used_bits_per_row);
    CHECK(a->expected_error <= prev_error);
    prev_error = a->expected_error;
    // Trailing dropped groups are cut from the basis.
    if (!a->ranges.empty()) {
      CHECK(a->components == a->ranges.back().end_idx);
    } else {
      CHECK(a->components == 0);
    }
  }
  // With enough budget every group gets fp8 (the least modelled error).
  CHECK(prev_error < 0.01 * DecayingVariances(64, 0.9)[0]);
}

TEST_CASE("bit allocation: leftover budget cannot buy any improvement",
          "[kvtc_bit_allocation]") {
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  for (int trial = 0; trial < 20; ++trial) {
    std::vector<double> var(40);
    for (double& v : var) v = std::pow(10.0, 3 * u(rng) - 2);
    auto groups = ModelGroupErrors(var, 4);
    REQUIRE(groups.ok());
    BitAllocationOptions opt;
    opt.budget_bits_per_row = 8 * static_cast<uint64_t>(5 + 40 * u(rng));
    auto a = AllocateKvtcBits(*groups, opt);
    REQUIRE(a.ok());
    REQUIRE(a->used_bits_per_row <= opt.budget_bits_per_row);
    const uint64_t left = opt.budget_bits_per_row - a->used_bits_per_row;
    // A global optimum is also optimal against every single-group change.
    for (size_t g = 0; g < groups->size(); ++g) {
      const auto cur = a->choices[g];
      const uint64_t cur_cost = KvtcGroupCostBits((*groups)[g].width, cur);
      for (int k = 0; k < kNumKvtcGroupChoices; ++k) {
        const auto alt = static_cast<KvtcGroupChoice>(k);
        if (KvtcGroupCostBits((*groups)[g].width, alt) > cur_cost + left) {
          continue;
        }
        CHECK((*groups)[g].error[k] >=
              (*groups)[g].error[static_cast<int>(cur)]);
      }
    }
  }
}

TEST_CASE("bit allocation: matches exhaustive search on small inputs",
          "[kvtc_bit_allocation]") {
  std::mt19937 rng(11);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  for (int trial = 0; trial < 10; ++trial) {
    std::vector<KvtcGroupErrors> groups(5);
    for (auto& g : groups) {
      g.width = 1 + rng() % 9;
      for (double& e : g.error) e = u(rng);
    }
    const uint64_t budget = 8 * (rng() % 40);
    double best = std::numeric_limits<double>::infinity();
    for (int code = 0; code < 1024; ++code) {
      uint64_t bits = 0;
      double err = 0;
      for (int g = 0, c = code; g < 5; ++g, c /= 4) {
        bits += KvtcGroupCostBits(groups[g].width,
                                  static_cast<KvtcGroupChoice>(c % 4));
        err += groups[g].error[c % 4];
      }
      if (bits <= budget) best = std::min(best, err);
    }
    BitAllocationOptions opt;
    opt.budget_bits_per_row = budget;
    auto a = AllocateKvtcBits(groups, opt);
    REQUIRE(a.ok());
    CHECK(a->expected_error == Approx(best).epsilon(1e-12));
    CHECK(a->used_bits_per_row <= budget);
  }
}

TEST_CASE("bit allocation: low-rank input gets bits on its top components only",
          "[kvtc_bit_allocation]") {
  // Rank 8 in 64 components: the tail has (numerically) no variance.
  std::vector<double> var(64, 0.0);
  for (int i = 0; i < 8; ++i) var[i] = 4.0 / (i + 1);
  auto groups = ModelGroupErrors(var, 4);
  REQUIRE(groups.ok());
  for (uint64_t budget : {64u, 256u, 1024u, 4096u}) {
    BitAllocationOptions opt;
    opt.budget_bits_per_row = budget;
    auto a = AllocateKvtcBits(*groups, opt);
    REQUIRE(a.ok());
    INFO("budget " << budget);
    CHECK(a->components <= 8);
    CHECK(a->components > 0);
    for (const KvtcRange& r : a->ranges) CHECK(r.end_idx <= 8);
  }
  // A generous budget makes the top components fp8.
  BitAllocationOptions opt;
  opt.budget_bits_per_row = 4096;
  auto a = AllocateKvtcBits(*groups, opt);
  REQUIRE(a.ok());
  REQUIRE(a->ranges.size() == 1);
  CHECK(a->ranges[0] == KvtcRange{KvtcQuantType::kFp8, 0, 0, 8});
  CHECK(a->used_bits_per_row == 64);
}

TEST_CASE("bit allocation: metadata is what makes tiny budgets drop groups",
          "[kvtc_bit_allocation]") {
  // One group of 32 equal components: int2 needs 64 + 64 bits per row.
  auto groups = ModelGroupErrors(std::vector<double>(32, 1.0), 32);
  REQUIRE(groups.ok());
  BitAllocationOptions opt;
  opt.budget_bits_per_row = 127;
  auto a = AllocateKvtcBits(*groups, opt);
  REQUIRE(a.ok());
  CHECK(a->choices[0] == KvtcGroupChoice::kNone);
  CHECK(a->ranges.empty());
  CHECK(a->components == 0);
  CHECK(a->expected_error == Approx(32.0));
  opt.budget_bits_per_row = 128;
  a = AllocateKvtcBits(*groups, opt);
  REQUIRE(a.ok());
  CHECK(a->choices[0] == KvtcGroupChoice::kInt2);
  CHECK(a->used_bits_per_row == 128);
}

TEST_CASE("bit allocation: fp8 groups merge, intx groups merge on request",
          "[kvtc_bit_allocation]") {
  std::vector<KvtcGroupErrors> groups(4);
  for (size_t i = 0; i < groups.size(); ++i) {
    groups[i].width = 4;
    // Groups 0-1 do best in fp8, groups 2-3 in int4.
    groups[i].error = i < 2 ? std::array<double, 4>{1.0, 0.5, 0.1, 0.01}
                            : std::array<double, 4>{1.0, 0.5, 0.01, 0.1};
  }
  BitAllocationOptions opt;
  opt.budget_bits_per_row = 2 * 32 + 2 * (64 + 16);  // 2 fp8 + 2 int4
  auto a = AllocateKvtcBits(groups, opt);
  REQUIRE(a.ok());
  REQUIRE(a->ranges.size() == 3);
  CHECK(a->ranges[0].quant_type == KvtcQuantType::kFp8);
  CHECK(a->ranges[0].end_idx - a->ranges[0].start_idx == 8);
  CHECK(a->ranges[1].int_bits == 4);
  CHECK(a->ranges[2].int_bits == 4);
  opt.merge_intx = true;
  a = AllocateKvtcBits(groups, opt);
  REQUIRE(a.ok());
  CHECK(a->ranges.size() == 2);
  CHECK(RangeBits(a->ranges) <= opt.budget_bits_per_row);
}

TEST_CASE("bit allocation: bad input is refused with the field named",
          "[kvtc_bit_allocation]") {
  BitAllocationOptions opt;
  opt.budget_bits_per_row = 100;
  CHECK(AllocateKvtcBits({}, opt).status().message().find("groups") !=
        std::string::npos);
  std::vector<KvtcGroupErrors> groups(2);
  groups[0].width = 4;
  groups[1].width = 0;
  auto s = AllocateKvtcBits(groups, opt).status();
  CHECK(s.message().find("groups[1].width") != std::string::npos);
  groups[1].width = 4;
  groups[1].error[2] = std::nan("");
  s = AllocateKvtcBits(groups, opt).status();
  CHECK(s.message().find("groups[1].error[int4]") != std::string::npos);
  CHECK(!ModelGroupErrors({1.0, -1.0}, 4).ok());
  CHECK(!ModelGroupErrors({1.0}, 0).ok());
  // A table too large for memory is refused, not attempted.
  std::vector<KvtcGroupErrors> many(4096);
  for (auto& g : many) g.width = 1 << 20;
  opt.budget_bits_per_row = uint64_t{1} << 40;
  s = AllocateKvtcBits(many, opt).status();
  CHECK(s.message().find("budget_bits_per_row") != std::string::npos);
}

}  // namespace
}  // namespace kvharbor

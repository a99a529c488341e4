#include <algorithm>
#include <cmath>
#include <cstdint>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "cli/cli_format.h"
#include "cli/cli_handlers.h"
#include "core/base/status_macros.h"
#include "core/calibration/kv_samples.h"
#include "core/codec/page_elements.h"
#include "types/geometry.h"

namespace kvharbor {
namespace cli {
namespace {

using Prompt = std::vector<int32_t>;

// One prompt per line; the error names the line so a long file is fixable.
absl::StatusOr<std::vector<Prompt>> ReadPrompts(const std::string& path) {
  KVH_ASSIGN_OR_RETURN(std::string text, ReadFile(path, "--tokens_file"));
  std::vector<Prompt> prompts;
  size_t line_no = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_no;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line[0] == '#') continue;
    KVH_ASSIGN_OR_RETURN(
        Prompt p,
        ParseTokens(line, absl::StrCat("--tokens_file line ", line_no)));
    prompts.push_back(std::move(p));
  }
  if (prompts.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tokens_file: ", path, " holds no prompt"));
  }
  return prompts;
}

// Default: the namespace's own element type where the file format has it
// (lossless), F32 otherwise (fp32 and fp8 pages).
absl::StatusOr<StDType> OutputDType(const Args& args, DType stored) {
  const std::optional<std::string> name = args.Get("dtype");
  if (!name.has_value()) {
    if (stored == DType::kBF16) return StDType::kBF16;
    if (stored == DType::kFP16) return StDType::kF16;
    return StDType::kF32;
  }
  if (*name == "bf16") return StDType::kBF16;
  if (*name == "fp16") return StDType::kF16;
  if (*name == "f32") return StDType::kF32;
  return absl::InvalidArgumentError(absl::StrCat(
      "--dtype: unknown value '", *name, "' (want bf16, fp16 or f32)"));
}

absl::StatusOr<RopeStyle> ParseRopeStyle(absl::string_view name) {
  for (RopeStyle s :
       {RopeStyle::kNone, RopeStyle::kInterleaved, RopeStyle::kHalfSplit}) {
    if (name == RopeStyleName(s)) return s;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--rope_style: unknown value '", name,
                   "' (want none, interleaved or half_split)"));
}

// RoPE of the samples: theta from the namespace's geometry when it has one,
// else --rope_theta; style from the namespace's online calibration, else
// --rope_style; otherwise none (noted on stderr).
absl::Status ResolveRope(const Context& ctx, const Args& args,
                         const client::NamespaceSpec& spec, KvSamples* s) {
  float theta = spec.geometry.rope_theta;
  if (const auto flag = args.Get("rope_theta")) {
    double value = 0;
    if (!absl::SimpleAtod(*flag, &value) || !std::isfinite(value) ||
        value <= 1.0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--rope_theta: '", *flag, "' must be a finite number > 1"));
    }
    if (theta != 0.0f && static_cast<float>(value) != theta) {
      return absl::InvalidArgumentError(
          absl::StrCat("--rope_theta: ", *flag, " contradicts namespace ",
                       spec.name, "'s geometry.rope_theta ", theta));
    }
    theta = static_cast<float>(value);
  }
  RopeStyle style = spec.online_calibration.rope_style;
  if (const auto flag = args.Get("rope_style")) {
    KVH_ASSIGN_OR_RETURN(style, ParseRopeStyle(*flag));
  }
  if (style != RopeStyle::kNone && !(theta > 1.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--rope_theta: rope_style ", RopeStyleName(style),
                     " needs a theta "
                     "and namespace ",
                     spec.name, " has no geometry.rope_theta"));
  }
  if (style == RopeStyle::kNone && ctx.err != nullptr) {
    *ctx.err << "note: rope_style none (neither namespace " << spec.name
             << " nor --rope_style names one); calibration will not undo "
                "RoPE on these keys\n";
  }
  s->rope_style = style;
  s->rope_theta = style == RopeStyle::kNone ? 0.0f : theta;
  s->keys_roped = style != RopeStyle::kNone;
  return absl::OkStatus();
}

struct CaptureCounts {
  uint64_t prompts_matched = 0;
  uint64_t pages = 0;
};

// Appends the rows of `pages` (prompt order) to `s`, up to `max_tokens`.
absl::Status AppendPages(const Geometry& g,
                         const std::vector<std::vector<uint8_t>>& pages,
                         uint64_t max_tokens, KvSamples* s) {
  const uint64_t features = g.ElementsPerTokenPerKv();
  std::vector<float> k(features * g.page_size), v(k.size());
  for (size_t p = 0; p < pages.size() && s->tokens < max_tokens; ++p) {
    if (pages[p].size() != g.PageBytes()) {
      return absl::DataLossError(
          absl::StrCat("pages[", p, "]: ", pages[p].size(),
                       " bytes, the geometry says ", g.PageBytes()));
    }
    const uint64_t take =
        std::min<uint64_t>(g.page_size, max_tokens - s->tokens);
    if ((s->tokens + take) > kMaxKvSampleElements / features) {
      return absl::ResourceExhaustedError(
          absl::StrCat("--max_tokens: ", s->tokens + take, " tokens of ",
                       features, " features exceed the samples limit of ",
                       kMaxKvSampleElements, " elements; lower it"));
    }
    PageToTokenRows(g, pages[p].data(), k.data(), v.data());
    s->k.insert(s->k.end(), k.begin(), k.begin() + take * features);
    s->v.insert(s->v.end(), v.begin(), v.begin() + take * features);
    for (uint64_t t = 0; t < take; ++t) {
      s->positions.push_back(static_cast<int64_t>(p * g.page_size + t));
    }
    s->tokens += take;
  }
  return absl::OkStatus();
}

// Match(lock) -> Fetch RAW of the pages still needed -> Release, so the
// pages cannot be evicted between Match and Fetch.
absl::Status CapturePrompt(const Context& ctx, const std::string& ns,
                           const Geometry& g, const Prompt& prompt,
                           uint64_t max_tokens, KvSamples* s,
                           CaptureCounts* counts) {
  KVH_ASSIGN_OR_RETURN(client::Lease lease,
                       ctx.client->Match(ns, prompt, /*lock=*/true,
                                         absl::ZeroDuration(), ctx.call));
  if (!lease.locked()) return absl::OkStatus();  // nothing matched
  if (lease.pages.empty()) return ctx.client->Release(lease.id, ctx.call);
  // Pages still needed, without overflow for the default UINT64_MAX.
  const uint64_t remaining = max_tokens - s->tokens;
  const uint64_t wanted =
      remaining / g.page_size + (remaining % g.page_size != 0 ? 1 : 0);
  const uint32_t count =
      static_cast<uint32_t>(std::min<uint64_t>(wanted, lease.pages.size()));
  absl::StatusOr<std::vector<std::vector<uint8_t>>> pages =
      ctx.client->Fetch(ns, client::FetchSource::FromLease(lease.id, 0, count),
                        client::FetchFormat::kRaw, ctx.call);
  const absl::Status released = ctx.client->Release(lease.id, ctx.call);
  if (!pages.ok()) return pages.status();
  KVH_RETURN_IF_ERROR(released);
  ++counts->prompts_matched;
  counts->pages += pages->size();
  return AppendPages(g, *pages, max_tokens, s);
}

}  // namespace

absl::Status SamplesCapture(const Context& ctx, const Args& args,
                            const std::vector<std::string>& pos) {
  const std::string& ns = pos[0];
  KVH_ASSIGN_OR_RETURN(std::string tokens_path, args.Required("tokens_file"));
  KVH_ASSIGN_OR_RETURN(std::string out_path, args.Required("out"));
  KVH_ASSIGN_OR_RETURN(uint64_t max_tokens,
                       args.Uint("max_tokens", UINT64_MAX));
  if (max_tokens == 0) {
    return absl::InvalidArgumentError("--max_tokens: must be >= 1");
  }
  KVH_ASSIGN_OR_RETURN(std::vector<Prompt> prompts, ReadPrompts(tokens_path));
  absl::StatusOr<client::NamespaceInfo> info =
      ctx.client->DescribeNamespace(ns, ctx.call);
  if (!info.ok()) {
    return absl::Status(
        info.status().code(),
        absl::StrCat("namespace '", ns, "': ", info.status().message()));
  }
  const Geometry g = info->spec.geometry.Resolved();
  KVH_RETURN_IF_ERROR(g.Validate());
  KVH_ASSIGN_OR_RETURN(StDType dtype, OutputDType(args, g.dtype));
  KvSamples s;
  s.num_layers = g.num_layers;
  s.num_kv_heads = g.num_kv_heads;
  s.head_dim = g.head_dim;
  s.extra["source"] = "kvharbor samples capture";
  s.extra["namespace"] = ns;
  s.extra["stored_dtype"] = std::string(DTypeName(g.dtype));
  KVH_RETURN_IF_ERROR(ResolveRope(ctx, args, info->spec, &s));
  CaptureCounts counts;
  for (const Prompt& prompt : prompts) {
    if (s.tokens >= max_tokens) break;
    KVH_RETURN_IF_ERROR(
        CapturePrompt(ctx, ns, g, prompt, max_tokens, &s, &counts));
  }
  if (s.tokens == 0) {
    return absl::NotFoundError(absl::StrCat("--tokens_file: no prompt of ",
                                            tokens_path,
                                            " matched a cached page "
                                            "of namespace '",
                                            ns, "'"));
  }
  KVH_RETURN_IF_ERROR(WriteKvSamples(s, dtype, out_path));
  const uint64_t bytes =
      2 * s.k.size() * (dtype == StDType::kF32 ? 4 : 2) + 8 * s.tokens;
  *ctx.out << "captured " << s.tokens << " tokens from " << counts.pages
           << " pages of " << counts.prompts_matched << " of " << prompts.size()
           << " prompts (" << BytesWithHuman(bytes) << " of k/v/positions) to "
           << out_path << "\n";
  return absl::OkStatus();
}

}  // namespace cli
}  // namespace kvharbor

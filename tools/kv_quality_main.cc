// kvharbor-kv-quality: runs a llama2.c model (tools/llama2c_model.h) over a
// text teacher-forced and measures KV-cache codecs on its real cache.
//
//   kvharbor-kv-quality capture --model M --tokenizer T --text F
//       [--calib-fraction 0.5 | --calib-text C] [--chunk-chars N]
//       [--max-calib-sequences N] --out samples.safetensors
//     writes the KV samples (docs/kv_samples.md) of the calibration part.
//   kvharbor-kv-quality eval --model M --tokenizer T --text F
//       [--calib-fraction 0.5 | --calib-text C] [--chunk-chars N]
//       [--max-sequences N] [--max-calib-sequences N]
//       [--kvtc a.kvtc,b.kvtc] [--md out.md]
//       [--csv out.csv] [--commvq-bits 1,2] [--commvq-value-rows 8]
//       [--codecs identity,fp8,c8,kivi,nvfp4,kvtc,commvq]
//     evaluates identity (bf16), FP8, int8 per channel (scales fitted on the
//     calibration part), KIVI-2bit, NVFP4-style, each KVTC calibration and
//     CommVQ at each --commvq-bits setting (codebooks trained on the
//     calibration part, tools/kv_quality.h CommVqSetting) on the held-out
//     part and prints a markdown table. --codecs (default: all) keeps only
//     the named families, in the order above whatever order they are named
//     in; every row is deterministic, so a subset's rows equal the full
//     run's. CommVQ's bytes/token count the encoded buffer only; its
//     codebooks' size and their cost amortised over the held-out tokens are
//     printed in a note under the table.
//
// The text is split into sequences at "<|endoftext|>", or with
// --chunk-chars N into consecutive chunks of N characters; each is BOS +
// tokens, truncated to seq_len. The first calib-fraction of the sequences
// is the calibration part, the rest the held-out part; with --calib-text
// the calibration part comes from that file and all of --text is held out.
// --max-sequences / --max-calib-sequences keep that many, evenly spaced.
// Every codec also gets the top-1 agreement with the clean model (the
// share of positions whose most likely next token is unchanged), and an
// NVFP4-style 4-bit baseline (tools/kv_quality.h Nvfp4RoundTrip) runs beside
// KIVI.
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "core/base/status_macros.h"
#include "core/calibration/kv_samples.h"
#include "core/codec/c8/int8_c8_codec.h"
#include "core/codec/codec.h"
#include "core/codec/commvq/commvq_codec.h"
#include "core/codec/kvtc/kvtc_calibration.h"
#include "core/codec/kvtc/kvtc_codec.h"
#include "tools/kv_quality.h"
#include "tools/llama2c_model.h"

namespace kvharbor {
namespace {

struct Args {
  std::string mode;
  std::map<std::string, std::string> flags;
  std::string Get(const std::string& k, const std::string& def = "") const {
    auto it = flags.find(k);
    return it == flags.end() ? def : it->second;
  }
};

absl::StatusOr<Args> ParseArgs(int argc, char** argv) {
  Args a;
  if (argc < 2) return absl::InvalidArgumentError("mode: capture or eval");
  a.mode = argv[1];
  if (a.mode != "capture" && a.mode != "eval") {
    return absl::InvalidArgumentError(
        absl::StrCat("mode: '", a.mode, "' is not capture or eval"));
  }
  for (int i = 2; i < argc; i += 2) {
    const std::string f = argv[i];
    if (f.rfind("--", 0) != 0 || i + 1 >= argc) {
      return absl::InvalidArgumentError(
          absl::StrCat(f, ": expected --flag value"));
    }
    a.flags[f.substr(2)] = argv[i + 1];
  }
  static const auto* const kKnown =
      new std::set<std::string>{"model",
                                "tokenizer",
                                "text",
                                "calib-fraction",
                                "calib-text",
                                "chunk-chars",
                                "max-sequences",
                                "max-calib-sequences",
                                "out",
                                "kvtc",
                                "md",
                                "csv",
                                "commvq-bits",
                                "commvq-value-rows",
                                "codecs"};
  for (const auto& [flag, value] : a.flags) {
    if (kKnown->count(flag) == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", flag, ": unknown flag"));
    }
  }
  for (const char* req : {"model", "tokenizer", "text"}) {
    if (a.Get(req).empty()) {
      return absl::InvalidArgumentError(absl::StrCat("--", req, ": required"));
    }
  }
  return a;
}

struct Data {
  std::unique_ptr<Llama2cModel> model;
  std::vector<KvSequence> seqs;
  std::vector<const KvSequence*> calib, held_out;
};

absl::StatusOr<std::string> ReadText(const std::string& path,
                                     const std::string& flag) {
  std::ifstream f(path);
  if (!f)
    return absl::NotFoundError(absl::StrCat(flag, ": cannot open ", path));
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

absl::StatusOr<uint64_t> FlagU64(const Args& a, const std::string& name,
                                 uint64_t def) {
  const std::string v = a.Get(name);
  if (v.empty()) return def;
  uint64_t n = 0;
  if (!absl::SimpleAtoi(v, &n)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", name, ": '", v, "' is not an unsigned integer"));
  }
  return n;
}

// Sequences of `text` (see the file comment), at most `max` evenly spaced
// ones (0: all).
absl::StatusOr<std::vector<KvSequence>> Sequences(const Args& a,
                                                  const std::string& text,
                                                  const Llama2cTokenizer& tok,
                                                  const Llama2cConfig& c,
                                                  uint64_t max) {
  KVH_ASSIGN_OR_RETURN(const uint64_t chunk, FlagU64(a, "chunk-chars", 0));
  std::vector<std::string> parts;
  if (chunk > 0) {
    for (size_t i = 0; i + chunk <= text.size(); i += chunk) {
      parts.push_back(text.substr(i, chunk));
    }
  } else {
    for (absl::string_view story : absl::StrSplit(text, "<|endoftext|>")) {
      story = absl::StripAsciiWhitespace(story);
      if (!story.empty()) parts.emplace_back(story);
    }
  }
  if (max > 0 && parts.size() > max) {
    std::vector<std::string> kept;
    for (uint64_t i = 0; i < max; ++i) {
      kept.push_back(parts[i * parts.size() / max]);
    }
    parts.swap(kept);
  }
  std::vector<KvSequence> out;
  for (const std::string& p : parts) {
    KvSequence s;
    s.tokens = tok.Encode(p, /*bos=*/true);
    if (s.tokens.size() > size_t(c.seq_len)) s.tokens.resize(c.seq_len);
    if (s.tokens.size() < 2) continue;
    out.push_back(std::move(s));
  }
  return out;
}

absl::StatusOr<Data> LoadData(const Args& a) {
  Data d;
  KVH_ASSIGN_OR_RETURN(Llama2cModel m, Llama2cModel::Load(a.Get("model")));
  d.model = std::make_unique<Llama2cModel>(std::move(m));
  const Llama2cConfig& c = d.model->config();
  KVH_ASSIGN_OR_RETURN(
      const Llama2cTokenizer tok,
      Llama2cTokenizer::Load(a.Get("tokenizer"), c.vocab_size));
  double fraction = 0.5;
  if (!absl::SimpleAtod(a.Get("calib-fraction", "0.5"), &fraction) ||
      !(fraction > 0 && fraction < 1)) {
    return absl::InvalidArgumentError("--calib-fraction: must be in (0, 1)");
  }
  KVH_ASSIGN_OR_RETURN(const uint64_t max_held, FlagU64(a, "max-sequences", 0));
  KVH_ASSIGN_OR_RETURN(const uint64_t max_calib,
                       FlagU64(a, "max-calib-sequences", 0));
  KVH_ASSIGN_OR_RETURN(const std::string text,
                       ReadText(a.Get("text"), "--text"));
  size_t n_cal = 0;
  if (!a.Get("calib-text").empty()) {
    KVH_ASSIGN_OR_RETURN(const std::string ctext,
                         ReadText(a.Get("calib-text"), "--calib-text"));
    KVH_ASSIGN_OR_RETURN(d.seqs, Sequences(a, ctext, tok, c, max_calib));
    n_cal = d.seqs.size();
    KVH_ASSIGN_OR_RETURN(std::vector<KvSequence> held,
                         Sequences(a, text, tok, c, max_held));
    for (KvSequence& s : held) d.seqs.push_back(std::move(s));
    if (n_cal == 0 || n_cal == d.seqs.size()) {
      return absl::InvalidArgumentError(
          "--calib-text, --text: each needs at least one sequence");
    }
  } else {
    KVH_ASSIGN_OR_RETURN(d.seqs, Sequences(a, text, tok, c, 0));
    if (d.seqs.size() < 2) {
      return absl::InvalidArgumentError("--text: fewer than 2 sequences");
    }
    n_cal = std::max<size_t>(
        1, std::min(d.seqs.size() - 1, size_t(fraction * d.seqs.size())));
  }
  uint64_t tokens = 0;
  for (KvSequence& s : d.seqs) {
    KVH_ASSIGN_OR_RETURN(s.clean, d.model->Run(s.tokens));
    tokens += s.tokens.size();
  }
  for (size_t i = 0; i < d.seqs.size(); ++i) {
    (i < n_cal ? d.calib : d.held_out).push_back(&d.seqs[i]);
  }
  if (max_held > 0 && d.held_out.size() > max_held) {
    std::vector<const KvSequence*> kept;
    for (uint64_t i = 0; i < max_held; ++i) {
      kept.push_back(d.held_out[i * d.held_out.size() / max_held]);
    }
    d.held_out.swap(kept);
  }
  std::fprintf(stderr,
               "model: dim %d, %d layers, %d heads, %d kv heads, vocab %d; "
               "%zu sequences, %llu tokens (%zu for calibration, %zu held "
               "out)\n",
               c.dim, c.n_layers, c.n_heads, c.n_kv_heads, c.vocab_size,
               d.seqs.size(), static_cast<unsigned long long>(tokens), n_cal,
               d.held_out.size());
  return d;
}

absl::Status Capture(const Args& a) {
  KVH_ASSIGN_OR_RETURN(const Data d, LoadData(a));
  const std::string out = a.Get("out");
  if (out.empty()) return absl::InvalidArgumentError("--out: required");
  const KvSamples s = SamplesFrom(d.calib, d.model->config());
  KVH_RETURN_IF_ERROR(WriteKvSamples(s, StDType::kF32, out));
  std::fprintf(stderr, "wrote %llu tokens of KV samples to %s\n",
               static_cast<unsigned long long>(s.tokens), out.c_str());
  return absl::OkStatus();
}

std::string Table(const std::vector<QualityRow>& rows, double base_loss) {
  std::string s =
      "| codec | bytes/token | ratio vs bf16 | K rel. err | V rel. err | "
      "attn-out rel. err | loss (nats/token) | loss increase | top-1 agree "
      "|\n"
      "|---|---:|---:|---:|---:|---:|---:|---:|---:|\n";
  for (const QualityRow& r : rows) {
    absl::StrAppendFormat(&s,
                          "| %s | %.1f | %.2f | %.4f | %.4f | %.4f | %.4f | "
                          "%+.4f | %.4f |\n",
                          r.codec, r.bytes_per_token, r.ratio_vs_bf16,
                          r.k_rel_error, r.v_rel_error, r.attn_rel_error,
                          r.loss, r.loss - base_loss, r.top1_agreement);
  }
  return s;
}

using PagedFn = std::function<absl::Status(
    const std::string&, absl::StatusOr<std::unique_ptr<Codec>>)>;

// Trains and evaluates CommVQ at each --commvq-bits setting; returns the
// notes on codebook sizes for under the table.
absl::StatusOr<std::string> EvalCommVq(const Args& a, const Data& d,
                                       const PagedFn& paged) {
  const Llama2cConfig& c = d.model->config();
  uint32_t value_rows = 8;
  if (!absl::SimpleAtoi(a.Get("commvq-value-rows", "8"), &value_rows)) {
    return absl::InvalidArgumentError("--commvq-value-rows: not a number");
  }
  uint64_t held_tokens = 0;
  for (const KvSequence* s : d.held_out) held_tokens += s->tokens.size();
  std::string notes;
  for (absl::string_view b :
       absl::StrSplit(a.Get("commvq-bits"), ',', absl::SkipEmpty())) {
    uint32_t bits = 0;
    if (!absl::SimpleAtoi(b, &bits)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--commvq-bits: '", b, "' is not a number"));
    }
    KVH_ASSIGN_OR_RETURN(const CommVqConfig cfg,
                         CommVqSetting(c, bits, value_rows));
    KVH_ASSIGN_OR_RETURN(auto cb, TrainCommVq(d.calib, cfg, {}));
    const std::string name =
        absl::StrFormat("commvq %u-bit (K R%u Nc'%u g%u; V %ux%u)", bits,
                        cfg.key_stages, cfg.key_levels, cfg.key_group_pairs,
                        cfg.value_stages, cfg.value_stage_rows);
    CodecParams p;
    p.geometry = ModelGeometry(c, 16, DType::kBF16);
    KVH_RETURN_IF_ERROR(
        paged(name, [&]() -> absl::StatusOr<std::unique_ptr<Codec>> {
          KVH_ASSIGN_OR_RETURN(auto codec, CommVqCodec::Create(p, cb));
          return std::unique_ptr<Codec>(std::move(codec));
        }()));
    const double cb_bytes = 4.0 * (cfg.key_floats() + cfg.value_floats());
    absl::StrAppendFormat(
        &notes,
        "\n%s: codebooks %.0f bytes (float32), not in bytes/token; amortised "
        "over the %llu held-out tokens they add %.1f bytes/token.",
        name, cb_bytes, static_cast<unsigned long long>(held_tokens),
        cb_bytes / double(held_tokens));
  }
  if (!notes.empty()) notes += "\n";
  return notes;
}

// The --md table and --csv rows of Eval's results, when asked for.
void WriteReports(const Args& a, size_t held_out,
                  const std::vector<QualityRow>& rows, double base,
                  const std::string& table) {
  if (!a.Get("md").empty()) {
    std::ofstream md(a.Get("md"));
    md << absl::StrFormat(
              "Held-out: %zu sequences; uncompressed (fp32 cache) loss "
              "%.4f nats/token.\n\n",
              held_out, base)
       << table;
  }
  if (!a.Get("csv").empty()) {
    std::ofstream csv(a.Get("csv"));
    csv << "codec,bytes_per_token,ratio_vs_bf16,k_rel_err,v_rel_err,"
           "attn_rel_err,loss,loss_increase,top1_agreement\n";
    for (const QualityRow& r : rows) {
      csv << absl::StrFormat("%s,%.3f,%.4f,%.6f,%.6f,%.6f,%.6f,%.6f,%.6f\n",
                             r.codec, r.bytes_per_token, r.ratio_vs_bf16,
                             r.k_rel_error, r.v_rel_error, r.attn_rel_error,
                             r.loss, r.loss - base, r.top1_agreement);
    }
  }
}

using AddFn =
    std::function<absl::Status(const std::string&, const DecodedCaches&)>;

// The fixed baselines --codecs keeps: identity (bf16), FP8, int8 C8, KIVI,
// NVFP4-style.
absl::Status EvalBaselines(const std::set<std::string>& want, const Data& d,
                           const PagedFn& paged, const AddFn& add) {
  const Llama2cConfig& c = d.model->config();
  CodecParams p;
  p.geometry = ModelGeometry(c, 16, DType::kBF16);
  if (want.count("identity")) {
    KVH_RETURN_IF_ERROR(paged("identity (bf16)", CreateIdentityCodec(p)));
  }
  if (want.count("fp8")) {
    CodecParams f = p;
    f.geometry.dtype = DType::kFP8E4M3;
    KVH_RETURN_IF_ERROR(paged("fp8 e4m3 (identity)", CreateIdentityCodec(f)));
  }
  if (want.count("c8")) {
    KVH_RETURN_IF_ERROR(paged(
        "int8 per-channel (c8)",
        [&]() -> absl::StatusOr<std::unique_ptr<Codec>> {
          KVH_ASSIGN_OR_RETURN(auto codec,
                               Int8C8Codec::Create(p, FitC8Scales(d.calib, c)));
          return std::unique_ptr<Codec>(std::move(codec));
        }()));
  }
  if (want.count("kivi")) {
    KVH_RETURN_IF_ERROR(
        add("kivi-2bit (g32)", KiviRoundTrip(d.held_out, c, 32)));
  }
  if (want.count("nvfp4")) {
    KVH_RETURN_IF_ERROR(
        add("nvfp4 (e2m1, e4m3 scale per 16)", Nvfp4RoundTrip(d.held_out, c)));
  }
  return absl::OkStatus();
}

// Each --kvtc calibration file, named after the file.
absl::Status EvalKvtc(const Args& a, const Llama2cConfig& c,
                      const PagedFn& paged) {
  for (absl::string_view path :
       absl::StrSplit(a.Get("kvtc"), ',', absl::SkipEmpty())) {
    KVH_ASSIGN_OR_RETURN(KvtcCalibration cal,
                         ReadKvtcCalibrationFile(std::string(path)));
    CodecParams kp;
    kp.geometry = ModelGeometry(c, cal.page_size, DType::kBF16);
    kp.calibration = std::make_shared<KvtcCalibration>(std::move(cal));
    std::string name(path);
    name = name.substr(name.find_last_of('/') + 1);
    if (absl::EndsWith(name, ".kvtc")) name.resize(name.size() - 5);
    KVH_RETURN_IF_ERROR(paged(absl::StrCat("kvtc ", name),
                              [&]() -> absl::StatusOr<std::unique_ptr<Codec>> {
                                KVH_ASSIGN_OR_RETURN(auto codec,
                                                     KvtcCodec::Create(kp));
                                return std::unique_ptr<Codec>(std::move(codec));
                              }()));
  }
  return absl::OkStatus();
}

// The codec families of --codecs (all when absent).
absl::StatusOr<std::set<std::string>> CodecFamilies(const Args& a) {
  static const char* const kFamilies[] = {"identity", "fp8",  "c8",    "kivi",
                                          "nvfp4",    "kvtc", "commvq"};
  std::set<std::string> all(std::begin(kFamilies), std::end(kFamilies));
  const std::string v = a.Get("codecs");
  if (v.empty()) return all;
  std::set<std::string> picked;
  for (absl::string_view f : absl::StrSplit(v, ',', absl::SkipEmpty())) {
    if (all.count(std::string(f)) == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--codecs: '", f,
          "' is not one of identity, fp8, c8, kivi, nvfp4, kvtc, commvq"));
    }
    picked.emplace(f);
  }
  if (picked.empty()) return absl::InvalidArgumentError("--codecs: empty");
  if (picked.count("kvtc") && a.Get("kvtc").empty()) {
    return absl::InvalidArgumentError(
        "--kvtc: --codecs names kvtc but no calibration files are given");
  }
  if (picked.count("commvq") && a.Get("commvq-bits").empty()) {
    return absl::InvalidArgumentError(
        "--commvq-bits: --codecs names commvq but no bit widths are given");
  }
  return picked;
}

absl::Status Eval(const Args& a) {
  KVH_ASSIGN_OR_RETURN(const std::set<std::string> want, CodecFamilies(a));
  KVH_ASSIGN_OR_RETURN(const Data d, LoadData(a));
  const Llama2cConfig& c = d.model->config();
  double nll = 0;
  uint64_t count = 0;
  for (const KvSequence* s : d.held_out) {
    nll += s->clean.nll_sum;
    count += s->clean.nll_count;
  }
  const double base = nll / double(count);
  std::fprintf(stderr, "uncompressed held-out loss: %.4f nats/token\n", base);
  std::vector<QualityRow> rows;
  auto add = [&](const std::string& name,
                 const DecodedCaches& dec) -> absl::Status {
    KVH_ASSIGN_OR_RETURN(QualityRow r,
                         Evaluate(name, *d.model, d.held_out, dec));
    std::fprintf(stderr, "%-32s %7.1f B/token  loss %.4f  top-1 %.4f\n",
                 name.c_str(), r.bytes_per_token, r.loss, r.top1_agreement);
    rows.push_back(std::move(r));
    return absl::OkStatus();
  };
  auto paged =
      [&](const std::string& name,
          absl::StatusOr<std::unique_ptr<Codec>> codec) -> absl::Status {
    if (!codec.ok()) return codec.status();
    KVH_ASSIGN_OR_RETURN(const DecodedCaches dec,
                         RoundTripPages(**codec, d.held_out));
    return add(name, dec);
  };
  KVH_RETURN_IF_ERROR(EvalBaselines(want, d, paged, add));
  if (want.count("kvtc")) KVH_RETURN_IF_ERROR(EvalKvtc(a, c, paged));
  std::string notes;
  if (want.count("commvq")) {
    KVH_ASSIGN_OR_RETURN(notes, EvalCommVq(a, d, paged));
  }
  const std::string table = Table(rows, base) + notes;
  std::printf("uncompressed (fp32 cache) held-out loss: %.4f nats/token\n\n%s",
              base, table.c_str());
  WriteReports(a, d.held_out.size(), rows, base, table);
  return absl::OkStatus();
}

}  // namespace
}  // namespace kvharbor

int main(int argc, char** argv) {
  auto args = kvharbor::ParseArgs(argc, argv);
  if (!args.ok()) {
    std::fprintf(stderr, "kvharbor-kv-quality: %s\n",
                 std::string(args.status().message()).c_str());
    return 2;
  }
  const absl::Status s = args->mode == "capture" ? kvharbor::Capture(*args)
                                                 : kvharbor::Eval(*args);
  if (!s.ok()) {
    std::fprintf(stderr, "kvharbor-kv-quality: %s\n",
                 std::string(s.message()).c_str());
    return 1;
  }
  return 0;
}

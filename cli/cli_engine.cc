#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "cli/cli_format.h"
#include "cli/cli_handlers.h"
#include "core/base/status_macros.h"

namespace kvharbor {
namespace cli {

namespace {

// A sequence from --tokens/--tokens_file or --keys/--keys_file, owning what
// the client::Sequence views.
struct SequenceArg {
  std::vector<int32_t> tokens;
  std::vector<std::string> keys;
  std::vector<absl::string_view> key_views;
  bool page_keys = false;

  client::Sequence View() const {
    return page_keys ? client::Sequence::OfKeys(key_views)
                     : client::Sequence::OfTokens(tokens);
  }
  size_t size() const { return page_keys ? keys.size() : tokens.size(); }
};

// Page keys in hex, separated by commas and/or whitespace.
absl::StatusOr<std::vector<std::string>> ParseKeys(absl::string_view text,
                                                   absl::string_view flag) {
  std::vector<std::string> keys;
  for (absl::string_view hex :
       absl::StrSplit(text, absl::ByAnyChar(", \t\n"), absl::SkipEmpty())) {
    const bool is_hex = !hex.empty() && hex.size() % 2 == 0 &&
                        hex.find_first_not_of("0123456789abcdefABCDEF") ==
                            absl::string_view::npos;
    if (!is_hex) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s[%u]: '%s' is not a page key in hex (1..%u bytes, 2 hex digits "
          "each)",
          flag, keys.size(), hex, client::kMaxPageKeyBytes));
    }
    keys.push_back(absl::HexStringToBytes(hex));
  }
  if (keys.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(flag, ": no page key"));
  }
  return keys;
}

absl::StatusOr<SequenceArg> SequenceFrom(const Args& args) {
  const int given = args.Has("tokens") + args.Has("tokens_file") +
                    args.Has("keys") + args.Has("keys_file");
  if (given != 1) {
    return absl::InvalidArgumentError(
        "--tokens/--tokens_file/--keys/--keys_file: give exactly one of them "
        "(keys: a page-key namespace)");
  }
  SequenceArg seq;
  if (args.Has("tokens")) {
    KVH_ASSIGN_OR_RETURN(seq.tokens,
                         ParseTokens(*args.Get("tokens"), "--tokens"));
  } else if (args.Has("tokens_file")) {
    KVH_ASSIGN_OR_RETURN(auto text,
                         ReadFile(*args.Get("tokens_file"), "--tokens_file"));
    KVH_ASSIGN_OR_RETURN(seq.tokens, ParseTokens(text, "--tokens_file"));
  } else {
    seq.page_keys = true;
    const bool file = args.Has("keys_file");
    const std::string flag = file ? "--keys_file" : "--keys";
    std::string text = *args.Get(file ? "keys_file" : "keys");
    if (file) {
      KVH_ASSIGN_OR_RETURN(text, ReadFile(text, flag));
    }
    KVH_ASSIGN_OR_RETURN(seq.keys, ParseKeys(text, flag));
    seq.key_views.assign(seq.keys.begin(), seq.keys.end());
  }
  return seq;
}

}  // namespace

absl::Status MatchCommand(const Context& ctx, const Args& args,
                          const std::vector<std::string>& pos) {
  KVH_ASSIGN_OR_RETURN(SequenceArg seq, SequenceFrom(args));
  KVH_ASSIGN_OR_RETURN(auto lock, args.Bool("lock"));
  KVH_ASSIGN_OR_RETURN(auto ttl_ms, args.Uint("ttl_ms", 0, UINT32_MAX));
  if (args.Has("ttl_ms") && !lock) {
    return absl::InvalidArgumentError("--ttl_ms: only with --lock");
  }
  KVH_ASSIGN_OR_RETURN(auto lease,
                       ctx.client->Match(pos[0], seq.View(), lock,
                                         absl::Milliseconds(ttl_ms), ctx.call));
  KeyValues kv;
  if (seq.page_keys) {
    kv.Add("matched_pages",
           absl::StrCat(lease.pages.size(), " of ", seq.size(), " keys"));
  }
  kv.Add("matched_tokens", seq.page_keys ? absl::StrCat(lease.matched_tokens)
                                         : absl::StrCat(lease.matched_tokens,
                                                        " of ", seq.size()));
  kv.Add("pages", absl::StrCat(lease.pages.size()));
  kv.Add("page_bytes", BytesWithHuman(lease.page_bytes));
  if (lease.locked()) {
    kv.Add("lease",
           absl::StrCat(lease.id, " expires ", FormatExpiry(lease.expiry)));
  } else if (lock) {
    kv.Add("lease", "none (nothing matched)");
  }
  kv.Add("handles", absl::StrJoin(lease.pages, ","));
  kv.Add("tiers", absl::StrJoin(lease.page_tiers, ",",
                                [](std::string* out, client::Tier t) {
                                  absl::StrAppend(out, client::TierName(t));
                                }));
  kv.Print(*ctx.out);
  return absl::OkStatus();
}

absl::Status InsertCommand(const Context& ctx, const Args& args,
                           const std::vector<std::string>& pos) {
  KVH_ASSIGN_OR_RETURN(SequenceArg seq, SequenceFrom(args));
  KVH_ASSIGN_OR_RETURN(auto path, args.Required("file"));
  KVH_ASSIGN_OR_RETURN(auto data, ReadFile(path, "--file"));
  KVH_ASSIGN_OR_RETURN(auto skip, args.Uint("skip_pages", 0, UINT32_MAX));
  KVH_ASSIGN_OR_RETURN(auto info,
                       ctx.client->DescribeNamespace(pos[0], ctx.call));
  const uint64_t page_bytes = info.stats.page_bytes != 0
                                  ? info.stats.page_bytes
                                  : info.spec.geometry.PageBytes();
  const uint32_t page_size = info.spec.geometry.page_size;
  uint64_t pages = seq.size();
  if (!seq.page_keys) {
    if (page_size == 0 || seq.size() % page_size != 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "--tokens: %u tokens is not a whole number of pages of %u tokens",
          seq.size(), page_size));
    }
    pages = seq.size() / page_size;
  }
  if (skip > pages) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--skip_pages: %u is more than the sequence's %u pages", skip, pages));
  }
  // The file holds every page, or (with --skip_pages) only the new ones.
  if (data.size() != pages * page_bytes &&
      (skip == 0 || data.size() != (pages - skip) * page_bytes)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--file: '%s' holds %u bytes; the sequence's %u pages of %u bytes "
        "take %u%s",
        path, data.size(), pages, page_bytes, pages * page_bytes,
        skip == 0 ? std::string()
                  : absl::StrFormat(" (or %u for the %u pages after the %u "
                                    "skipped)",
                                    (pages - skip) * page_bytes, pages - skip,
                                    skip)));
  }
  client::InsertOptions options;
  options.skip_pages = static_cast<uint32_t>(skip);
  KVH_ASSIGN_OR_RETURN(
      auto r,
      ctx.client->Insert(
          pos[0], seq.View(),
          absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(data.data()),
                              data.size()),
          page_bytes, options, ctx.call));
  *ctx.out << "inserted " << pages << " pages: " << r.pages_stored
           << " stored, " << r.already_present_tokens
           << " tokens already present, " << r.pages_evicted
           << " evicted for room";
  if (skip > 0) *ctx.out << ", " << skip << " skipped (not sent)";
  *ctx.out << "\n";
  return absl::OkStatus();
}

absl::Status LayersFrom(const Args& args, client::FetchSource* source) {
  if (!args.Has("layers")) return absl::OkStatus();
  const std::string text = *args.Get("layers");
  std::vector<absl::string_view> parts = absl::StrSplit(text, ':');
  uint32_t begin = 0, end = 0;
  if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &begin) ||
      !absl::SimpleAtoi(parts[1], &end) || begin >= end) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--layers: '", text, "' is not BEGIN:END with BEGIN < END"));
  }
  *source = source->Layers(begin, end);
  return absl::OkStatus();
}

absl::StatusOr<client::KeyKind> KeyKindFrom(const Args& args) {
  return ParseKeyKind("--key_kind", args.Get("key_kind").value_or("tokens"));
}

}  // namespace cli
}  // namespace kvharbor

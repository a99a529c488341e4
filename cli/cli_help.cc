#include "cli/cli_help.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/base/text_wrap.h"

namespace kvharbor {
namespace cli {
namespace {

// What a flag means: `command` "" for every command that takes the flag,
// else the command's words joined by spaces (which wins). `value` names the
// flag's value in the help ("" for a boolean flag).
struct FlagText {
  const char* command;
  const char* flag;
  const char* value;
  const char* text;
};

constexpr FlagText kFlagTexts[] = {
    // ns create
    {"ns create", "layers", "N", "transformer layers (1..1024); required"},
    {"ns create", "kv_heads", "N", "KV heads per layer (1..1024); required"},
    {"ns create", "head_dim", "N", "elements per head (1..4096); required"},
    {"ns create", "page_size", "N", "tokens per page (1..4096); required"},
    {"ns create", "dtype", "T",
     "element type of the pages: bf16, fp16, fp32 or fp8_e4m3; required"},
    {"ns create", "layout", "L",
     "dimension order of a page: kv_layer_token_head_dim (default) or "
     "layer_kv_token_head_dim"},
    {"ns create", "capacity_bytes", "N",
     "bytes of the namespace's page pool, rounded down to whole pages "
     "(default 0: the daemon's store.default_namespace_bytes, or what is left "
     "of its pool budget)"},
    {"ns create", "codec", "C",
     "codec of pages leaving the pool and of --format compressed fetches: "
     "identity (default), kvtc, int8_c8 or commvq; the last three need "
     "--calibration (kvtc: or --online_calibration)"},
    {"ns create", "calibration", "PATH",
     "calibration of the codec, a path on the daemon's machine: kvtc a file "
     "from kvharbor-calibrate, int8_c8 an msmodelslim export directory, "
     "commvq a codebook file"},
    {"ns create", "host_compressed_bytes", "N",
     "host memory for pages evicted from the pool, stored as codec buffers "
     "(default 0: no cold tiers, eviction drops pages)"},
    {"ns create", "disk_dir", "DIR",
     "disk tier on the daemon's machine, one file per page, one directory per "
     "namespace; needs --host_compressed_bytes"},
    {"ns create", "disk_bytes", "N",
     "budget of the disk tier (default 0: unlimited); needs --disk_dir"},
    {"ns create", "kvcm_path", "PATH",
     "KVCM compressor weights on the daemon's machine; enables fetch "
     "--transform kvcm"},
    {"ns create", "rope_theta", "F",
     "RoPE base of the model (default 0: none)"},
    {"ns create", "if_not_exists", "",
     "a namespace of that name with the same spec is not an error (prints "
     "'exists')"},
    {"ns create", "online_calibration", "",
     "codec kvtc only: calibrate KVTC in the daemon from sampled inserted "
     "pages (evicted pages are stored as fp8 until then; docs/calibration.md)"},
    {"ns create", "online_min_tokens", "N",
     "inserted tokens before the online calibration runs (default 0: 65536)"},
    {"ns create", "online_max_sample_tokens", "N",
     "tokens kept in the online sample (default 0: 16384; at most 1 GiB of "
     "float32 K and V)"},
    {"ns create", "online_target_ratio", "R",
     "compression ratio the online KVTC calibration aims at, every stored "
     "byte counted (default 0: 16; >= 1 and reachable for the geometry)"},
    {"ns create", "key_kind", "K",
     "tokens (default): keyed by token ids; page_keys: by one opaque key of "
     "1..32 bytes per page; page_hashes: the same keys, each a chained hash "
     "that finds its page alone (docs/engines_api.md)"},
    // ns delete
    {"ns delete", "force", "",
     "delete even with active leases or uploads (else FAILED_PRECONDITION)"},
    // match, insert, samples capture
    {"", "tokens", "IDS",
     "token ids, comma- or space-separated; give --tokens or --tokens_file"},
    {"", "tokens_file", "FILE", "token ids read from FILE, as for --tokens"},
    {"", "keys", "HEX,HEX",
     "a page-key namespace's sequence: one key per page in hex (1..32 "
     "bytes), comma- or space-separated; instead of --tokens"},
    {"", "keys_file", "FILE", "page keys read from FILE, as for --keys"},
    {"samples capture", "tokens_file", "FILE",
     "cached prompts, one per line of token ids ('#' starts a comment line); "
     "required"},
    {"match", "lock", "",
     "lease the matched pages: they stay until release or the lease's TTL "
     "runs out"},
    {"match", "ttl_ms", "N",
     "with --lock: the lease's TTL (default 0: the daemon's "
     "store.default_lease_ttl_ms, 30000; capped by store.max_lease_ttl_ms, "
     "600000)"},
    {"insert", "file", "FILE",
     "the pages' bytes back to back, exactly tokens / page_size pages (or one "
     "per key) of page_bytes (ns describe); with --skip_pages it may hold "
     "only the pages after the skipped ones; required"},
    {"insert", "skip_pages", "N",
     "append: the first N pages are cached and are not sent (default 0); "
     "FAILED_PRECONDITION when they are not cached any more, unless the file "
     "holds them too (then they are sent)"},
    // fetch
    {"fetch", "lease", "ID",
     "fetch the pages of this lease (give --lease or --pages)"},
    {"fetch", "start", "N", "with --lease: first page to fetch (default 0)"},
    {"fetch", "count", "N",
     "with --lease: pages to fetch (default 0: to the end)"},
    {"fetch", "pages", "H1,H2",
     "fetch these page handles (from match's handles) without a lease"},
    {"fetch", "out", "FILE", "file the pages are written to; required"},
    {"fetch", "format", "F",
     "raw (default), or compressed: codec buffers on the wire, decoded and "
     "verified here"},
    {"fetch", "layers", "B:E",
     "only layers B..E-1 of each page, in the page layout restricted to them "
     "(default: every layer; raw format only)"},
    {"fetch", "transform", "kvcm",
     "LOSSY: one shorter KV sequence merged by the namespace's KVCM "
     "compressor instead of the pages, laid out "
     "[K|V][layer][token][kv_head][head_dim]"},
    // demote
    {"demote", "tier", "T",
     "host_compressed or disk: the tier unlocked pages move down to; "
     "required"},
    // calibration
    {"calibration get", "fingerprint", "F",
     "the calibration to write, decimal or 0x-hex (default: the active one)"},
    {"calibration pin", "fingerprint", "F",
     "must be the active calibration's fingerprint (default: whichever is "
     "active)"},
    {"calibration get", "out", "FILE",
     "file the calibration's bytes are written to; required"},
    {"calibration upload", "file", "FILE",
     "canonical calibration bytes, as calibration get writes them; required"},
    {"calibration upload", "pin", "",
     "pin it at once against online recalibration"},
    {"calibration pin", "unpin", "", "unpin instead of pin"},
    // extend
    {"extend", "ttl_ms", "N",
     "new TTL from now (default 0: the daemon's store.default_lease_ttl_ms, "
     "30000; capped by store.max_lease_ttl_ms)"},
    // evict
    {"evict", "bytes", "N",
     "evict at least N bytes of unlocked pages, least recently used first"},
    {"evict", "pages", "H1,H2",
     "evict these page handles and every page that extends them"},
    {"evict", "all", "", "evict every unlocked page"},
    // cluster status
    {"cluster status", "etcd", "URL[,URL]",
     "members registered in etcd (daemons with a cluster: section)"},
    {"cluster status", "etcd_prefix", "P",
     "with --etcd: their key prefix (default /kvharbor/members/)"},
    {"cluster status", "members", "H:P[,H:P]", "a static list of members"},
    {"cluster status", "dns", "NAME:PORT",
     "the addresses NAME resolves to (e.g. a headless Service), on PORT"},
    // samples capture
    {"samples capture", "out", "FILE",
     "the KV samples file (safetensors) to write; required"},
    {"samples capture", "max_tokens", "N",
     "stop after N tokens of samples (default: every matched token)"},
    {"samples capture", "dtype", "T",
     "element type of the samples: bf16, fp16 or f32 (default: the "
     "namespace's where the format has it, else f32)"},
    {"samples capture", "rope_style", "S",
     "none, interleaved or half_split: how the cached keys are rotated "
     "(default: the namespace's online calibration's, else none)"},
    {"samples capture", "rope_theta", "F",
     "RoPE base when the namespace's geometry has none (> 1)"},
    // tree
    {"tree", "max_nodes", "N", "nodes to print at most (default 0: 1000)"},
};

// More about a command than its one-line summary says.
struct CommandNote {
  const char* command;
  const char* text;
};

constexpr CommandNote kCommandNotes[] = {
    {"match",
     "A lease keeps the matched pages from eviction until kvharbor release, "
     "or until its TTL runs out: --ttl_ms, else the daemon's "
     "store.default_lease_ttl_ms (30 s by default); kvharbor extend renews "
     "it."},
    {"extend",
     "LEASE is the id match --lock printed; the new expiry is printed."},
    {"stats",
     "NAME: one namespace (default: every one). Per namespace and tier: "
     "pages, stored bytes and the stored ratio, raw bytes the pages "
     "represent / bytes stored (1.00 for raw pages; above 1 where the codec "
     "compresses)."},
};

const FlagText* FindFlagText(const Command& command, const std::string& flag) {
  const std::string name = absl::StrJoin(command.words, " ");
  const FlagText* any = nullptr;
  for (const FlagText& t : kFlagTexts) {
    if (flag != t.flag) continue;
    if (name == t.command) return &t;
    if (*t.command == '\0') any = &t;
  }
  return any;
}

std::string Words(const Command& c) { return absl::StrJoin(c.words, " "); }

void PrintCommandList(const std::vector<const Command*>& commands,
                      std::ostream& out) {
  size_t width = 0;
  for (const Command* c : commands) width = std::max(width, Words(*c).size());
  for (const Command* c : commands) {
    const std::string words = Words(*c);
    const std::string wrapped = WrapText(c->summary, width + 4);
    // The first line's indent holds the words.
    out << "  " << words << std::string(width - words.size() + 2, ' ')
        << wrapped.substr(width + 4);
  }
}

}  // namespace

void PrintHelp(std::ostream& out) {
  out << "usage: kvharbor [GLOBAL FLAGS] COMMAND [ARGS]\n"
         "       kvharbor COMMAND --help   (that command's usage and "
         "options)\n\n"
         "Client of the kvharbor KV-cache daemon.\n\n"
         "global flags (every command takes them):\n"
         "  --addr=HOST:PORT   daemon address (default 127.0.0.1:50051)\n"
         "  --timeout_ms=N     deadline of each call (default 30000)\n"
         "  --no_verify        do not verify fetched pages' checksums\n"
         "  --tls              use TLS (implied by the --tls_* flags below)\n"
         "  --tls_ca=FILE      PEM CA bundle that verifies the daemon "
         "(default:\n"
         "                     the system's roots)\n"
         "  --tls_cert=FILE    PEM client certificate (mutual TLS; with "
         "--tls_key)\n"
         "  --tls_key=FILE     PEM key of --tls_cert\n"
         "  --tls_server_name=NAME  name to check in the daemon's "
         "certificate\n"
         "                     instead of the host of --addr\n"
         "  --token=TOKEN      bearer token (default: the environment "
         "variable\n"
         "                     KVHARBOR_TOKEN; prefer it: flags show in "
         "ps)\n\n"
         "commands:\n";
  std::vector<const Command*> all;
  for (const Command& c : Commands()) all.push_back(&c);
  PrintCommandList(all, out);
  out << "\nLists (--tokens, --pages) are comma- or space-separated; handles "
         "may be decimal or 0x-hex.\nLeases expire after "
         "store.default_lease_ttl_ms (30 s by default) unless extended.\n";
}

void PrintCommandHelp(const Command& command, std::ostream& out) {
  // "usage:" is 6 columns: wrapped with a hanging indent of 7.
  const std::string usage = WrapText(
      absl::StrCat("kvharbor ", Words(command), " ", command.usage), 7);
  out << "usage:" << usage.substr(6) << "\n" << WrapText(command.summary, 0);
  for (const CommandNote& note : kCommandNotes) {
    if (Words(command) == note.command) {
      out << "\n" << WrapText(note.text, 0);
    }
  }
  out << "\n";
  if (!command.flags.empty()) {
    out << "options:\n";
    for (const std::string& flag : command.flags) {
      const FlagText* t = FindFlagText(command, flag);
      const bool takes_value = t != nullptr && *t->value != '\0';
      out << "  --" << flag << (takes_value ? "=" : "")
          << (takes_value ? t->value : "") << "\n"
          << WrapText(t != nullptr ? t->text : "(undocumented)", 6);
    }
    out << "\n";
  }
  out << "Global flags (--addr, --timeout_ms, --tls*, --token, --no_verify): "
         "kvharbor --help.\n";
}

bool PrintGroupHelp(const std::vector<std::string>& words, std::ostream& out) {
  std::vector<const Command*> group;
  for (const Command& c : Commands()) {
    if (c.words.size() > words.size() &&
        std::equal(words.begin(), words.end(), c.words.begin())) {
      group.push_back(&c);
    }
  }
  if (group.empty()) return false;
  out << "usage: kvharbor " << absl::StrJoin(words, " ")
      << " SUBCOMMAND [ARGS]\n\nsubcommands:\n";
  PrintCommandList(group, out);
  out << "\nkvharbor " << absl::StrJoin(words, " ")
      << " SUBCOMMAND --help: that subcommand's usage and options.\n";
  return true;
}

}  // namespace cli
}  // namespace kvharbor

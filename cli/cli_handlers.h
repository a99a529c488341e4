// The kvharbor CLI's command handlers that live outside cli_commands.cc, and
// the option parsers those share with it:
//   - cli_engine.cc: match and insert for both key kinds (--tokens / --keys)
//     with append (--skip_pages), and fetch's --layers (docs/engines_api.md);
//   - cli_cluster.cc: `kvharbor cluster status`;
//   - cli_samples.cc: `kvharbor samples capture`.
//
// Internal to the CLI (the table in cli_commands.h dispatches on them);
// stateless handlers that write to the Context's streams and return the
// SDK's status.
#ifndef KVHARBOR_CLI_CLI_HANDLERS_H_
#define KVHARBOR_CLI_CLI_HANDLERS_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cli/cli_args.h"
#include "cli/cli_commands.h"
#include "kvharbor/types.h"

namespace kvharbor {
namespace cli {

// ---- cli_engine.cc ----
absl::Status MatchCommand(const Context& ctx, const Args& args,
                          const std::vector<std::string>& pos);
absl::Status InsertCommand(const Context& ctx, const Args& args,
                           const std::vector<std::string>& pos);
// --layers B:E of fetch into `source` (absent: every layer).
absl::Status LayersFrom(const Args& args, client::FetchSource* source);
// --key_kind tokens|page_keys of ns create.
absl::StatusOr<client::KeyKind> KeyKindFrom(const Args& args);

// ---- cli_cluster.cc ----
// The members of a kvharbor cluster (from etcd, a static list or a DNS name)
// with each daemon's pages, bytes and load. Flags: exactly one of
// --etcd=URL[,URL] (with --etcd_prefix, default /kvharbor/members/),
// --members=HOST:PORT[,...] or --dns=NAME:PORT. UNAVAILABLE (after printing
// the table) when a member did not answer.
absl::Status ClusterStatus(const Context& ctx, const Args& args,
                           const std::vector<std::string>& pos);

// ---- cli_samples.cc ----
// Dumps the KV rows of cached prompts from a running daemon into a KV
// samples file (docs/kv_samples.md), the input of kvharbor-calibrate, using
// only Match (with a lease), Fetch RAW and Release. Holds the captured rows
// as float32 in memory (bounded by --max_tokens and kMaxKvSampleElements)
// until the file is written; the summary goes to the out stream, notes to
// the err stream.
// NAME --tokens_file FILE --out OUT [--max_tokens N] [--dtype bf16|fp16|f32]
// [--rope_style none|interleaved|half_split] [--rope_theta X]. FILE holds
// one prompt per line (token ids separated by whitespace and/or commas;
// blank lines and lines starting with '#' are skipped).
absl::Status SamplesCapture(const Context& ctx, const Args& args,
                            const std::vector<std::string>& pos);

}  // namespace cli
}  // namespace kvharbor

#endif  // KVHARBOR_CLI_CLI_HANDLERS_H_

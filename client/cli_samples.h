// `kvharbor samples capture`: dumps the KV rows of cached prompts from a
// running daemon into a KV samples file (docs/kv_samples.md), the input of
// kvharbor-calibrate. Uses only Match (with a lease), Fetch RAW and Release.
//
// Internal to the CLI; stateless. Holds the captured rows as float32 in
// memory (bounded by --max_tokens and kMaxKvSampleElements) until the file
// is written; writes the summary to the Context's out stream and notes to
// its err stream.
#ifndef KVHARBOR_CLIENT_CLI_SAMPLES_H_
#define KVHARBOR_CLIENT_CLI_SAMPLES_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "client/cli_args.h"
#include "client/cli_commands.h"

namespace kvharbor {
namespace cli {

// NAME --tokens_file FILE --out OUT [--max_tokens N] [--dtype bf16|fp16|f32]
// [--rope_style none|interleaved|half_split] [--rope_theta X]. FILE holds
// one prompt per line (token ids separated by whitespace and/or commas;
// blank lines and lines starting with '#' are skipped).
absl::Status SamplesCapture(const Context& ctx, const Args& args,
                            const std::vector<std::string>& pos);

}  // namespace cli
}  // namespace kvharbor

#endif  // KVHARBOR_CLIENT_CLI_SAMPLES_H_

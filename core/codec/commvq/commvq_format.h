// The CommVQ codebook file (version 1): reader and writer. Byte tables in
// docs/commvq_format.md. Little-endian; a 64-byte header, the key codebooks
// [layer][stage][pair][level][x, y] and the value codebooks
// [layer][row][dim] as float32, then an XXH3-64 (seed 0) checksum of every
// byte before it.
//
// The parser checks the length first, then magic, format version, header
// size, every header field (the same limits as CommVqConfig::Validate,
// named "commvq codebook file: header.<field>"), the exact file size
// computed with overflow-safe arithmetic, the checksum (DataLoss on a
// mismatch), and finally that every float is finite. It never reads out of
// bounds and allocates only after the size is known to match the file.
// Pure functions; thread-safe.
#ifndef KVHARBOR_CORE_CODEC_COMMVQ_COMMVQ_FORMAT_H_
#define KVHARBOR_CORE_CODEC_COMMVQ_COMMVQ_FORMAT_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "core/codec/commvq/commvq_codebooks.h"

namespace kvharbor {

inline constexpr char kCommVqFileMagic[8] = {'K', 'V', 'H', 'C',
                                             'M', 'V', 'Q', '1'};
inline constexpr uint32_t kCommVqFileVersion = 1;
inline constexpr size_t kCommVqFileHeaderBytes = 64;
inline constexpr size_t kCommVqFileChecksumBytes = 8;

// The 64 header bytes of `config` (which need not be valid).
std::string CommVqFileHeader(const CommVqConfig& config);

// Refuses codebooks that do not Validate().
absl::StatusOr<std::string> SerializeCommVqCodebooks(const CommVqCodebooks& cb);
absl::StatusOr<CommVqCodebooks> ParseCommVqCodebooks(
    absl::Span<const uint8_t> bytes);

absl::Status WriteCommVqCodebooksFile(const CommVqCodebooks& cb,
                                      const std::string& path);
absl::StatusOr<CommVqCodebooks> ReadCommVqCodebooksFile(
    const std::string& path);

}  // namespace kvharbor

#endif  // KVHARBOR_CORE_CODEC_COMMVQ_COMMVQ_FORMAT_H_

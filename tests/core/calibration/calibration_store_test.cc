// The persisted calibration files of a disk tier
// (core/calibration/calibration_store.h): round trips, and damaged or foreign
// files refused and removed by Scan.
#include "core/calibration/calibration_store.h"

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <string>

#include "tests/temp_dir.h"

namespace kvharbor {
namespace {

PersistedCalibration Sample(uint64_t fp) {
  PersistedCalibration c;
  c.codec = "kvtc";
  c.fingerprint = fp;
  c.source = 2;
  c.created_unix_micros = 1234567;
  c.bytes = std::string(300, 'x') + std::to_string(fp);
  return c;
}

void WriteRaw(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

TEST_CASE("calibration store: files round trip", "[calibration_store]") {
  const PersistedCalibration c = Sample(0xabc);
  auto back = ParsePersistedCalibration(SerializePersistedCalibration(c));
  REQUIRE(back.ok());
  CHECK(back->codec == c.codec);
  CHECK(back->fingerprint == c.fingerprint);
  CHECK(back->source == c.source);
  CHECK(back->created_unix_micros == c.created_unix_micros);
  CHECK(back->bytes == c.bytes);

  PersistedCalibrationState st;
  st.spec_codec = "kvtc";
  st.spec_fingerprint = 7;
  st.active_codec = "kvtc";
  st.active_fingerprint = 0xabc;
  st.pinned = true;
  auto s2 = ParseCalibrationState(SerializeCalibrationState(st));
  REQUIRE(s2.ok());
  CHECK(s2->spec_fingerprint == 7);
  CHECK(s2->active_fingerprint == 0xabc);
  CHECK(s2->pinned);
}

TEST_CASE("calibration store: every damaged byte is refused",
          "[calibration_store]") {
  const std::string good = SerializePersistedCalibration(Sample(5));
  for (size_t i = 0; i < good.size(); i += 7) {
    std::string bad = good;
    bad[i] ^= 0x01;
    CHECK(ParsePersistedCalibration(bad).status().code() ==
          absl::StatusCode::kDataLoss);
  }
  for (size_t n : {size_t{0}, size_t{10}, good.size() - 1}) {
    CHECK(!ParsePersistedCalibration(good.substr(0, n)).ok());
  }
  // A state file is not a calibration file and the other way round.
  CHECK(!ParseCalibrationState(good).ok());
}

TEST_CASE("calibration store: scan keeps good files, removes the others",
          "[calibration_store]") {
  testing::TempDir dir;
  CalibrationStore store(dir.path, nullptr);
  REQUIRE(store.Write(Sample(1)).ok());
  REQUIRE(store.Write(Sample(2)).ok());
  PersistedCalibrationState st;
  st.active_codec = "kvtc";
  st.active_fingerprint = 2;
  REQUIRE(store.WriteState(st).ok());
  // A torn file, a file under another fingerprint's name, a temp file and
  // a file that is not the store's.
  std::string torn = SerializePersistedCalibration(Sample(3));
  torn.resize(torn.size() / 2);
  WriteRaw(store.PathOf(3), torn);
  WriteRaw(store.PathOf(4), SerializePersistedCalibration(Sample(5)));
  WriteRaw(store.PathOf(6) + ".tmp", "partial");
  WriteRaw(dir.path + "/page-0000000000000001.kvh", "a page");

  CalibrationStore::ScanResult r = store.Scan();
  REQUIRE(r.calibrations.size() == 2);
  CHECK(r.calibrations[0].bytes != r.calibrations[1].bytes);
  REQUIRE(r.state.has_value());
  CHECK(r.state->active_fingerprint == 2);
  CHECK(r.dropped.size() == 3);
  CHECK(!std::filesystem::exists(store.PathOf(3)));
  CHECK(!std::filesystem::exists(store.PathOf(4)));
  CHECK(!std::filesystem::exists(store.PathOf(6) + ".tmp"));
  CHECK(std::filesystem::exists(dir.path + "/page-0000000000000001.kvh"));

  store.Remove(1);
  CHECK(!std::filesystem::exists(store.PathOf(1)));
  WriteRaw(store.StatePath(), "junk");
  r = store.Scan();
  CHECK(r.calibrations.size() == 1);
  CHECK(!r.state.has_value());
  CHECK(!std::filesystem::exists(store.StatePath()));
}

}  // namespace
}  // namespace kvharbor

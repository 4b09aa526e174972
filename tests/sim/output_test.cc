#include "sim/output.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace gmux::sim {
namespace {

namespace fs = std::filesystem;

// A fresh directory under the test's temporary directory.
std::string FreshDir(const std::string& name) {
  fs::path dir = fs::path(testing::TempDir()) / ("gmux_output_test_" + name);
  fs::remove_all(dir);
  return dir.string();
}

std::vector<Series> TwoRuns() {
  std::vector<Series> s;
  for (const char* run : {"same n=2 / fifo", "same n=2 / credit"}) {
    for (const char* tenant : {"vm1", "vm2"}) {
      Series x{run, tenant, "throughput", "blocks/s", {}};
      for (int w = 0; w < 5; ++w) {
        x.points.push_back({static_cast<double>(w), 100.0 * w + (tenant[2] - '0')});
      }
      s.push_back(x);
    }
  }
  return s;
}

std::vector<std::vector<std::string>> ReadCsv(const std::string& file) {
  std::ifstream in(file);
  std::vector<std::vector<std::string>> rows;
  std::string line;
  while (std::getline(in, line)) {
    std::vector<std::string> cells;
    std::stringstream ss(line);
    std::string cell;
    while (std::getline(ss, cell, ',')) cells.push_back(cell);
    if (!line.empty() && line.back() == ',') cells.push_back("");
    rows.push_back(cells);
  }
  return rows;
}

TEST(OutputTest, FileStemIsSafe) {
  EXPECT_EQ(FileStem("same n=3 / fifo"), "same-n-3-fifo");
  EXPECT_EQ(FileStem("../../etc/passwd"), "..-..-etc-passwd");
  EXPECT_EQ(FileStem("w=4:2:1 Credit"), "w-4-2-1-credit");
  EXPECT_EQ(FileStem("///"), "run");
}

TEST(OutputTest, CsvPerRunWithTimeAndOneColumnPerTenant) {
  const std::string dir = FreshDir("csv");
  auto files = WriteCsv(dir, TwoRuns());
  ASSERT_TRUE(files.ok()) << files.status().ToString();
  ASSERT_EQ(files->size(), 2u);
  EXPECT_EQ(fs::path((*files)[0]).filename(), "01-same-n-2-fifo.csv");
  EXPECT_EQ(fs::path((*files)[1]).filename(), "02-same-n-2-credit.csv");
  auto rows = ReadCsv((*files)[1]);
  ASSERT_EQ(rows.size(), 6u);
  EXPECT_EQ(rows[0], (std::vector<std::string>{"t_s", "vm1", "vm2"}));
  for (int w = 0; w < 5; ++w) {
    ASSERT_EQ(rows[w + 1].size(), 3u);
    EXPECT_DOUBLE_EQ(std::stod(rows[w + 1][0]), w);
    EXPECT_DOUBLE_EQ(std::stod(rows[w + 1][1]), 100.0 * w + 1);
    EXPECT_DOUBLE_EQ(std::stod(rows[w + 1][2]), 100.0 * w + 2);
  }
}

TEST(OutputTest, MisalignedSeriesLeaveEmptyCellsAndMetricsGetColumnNames) {
  std::vector<Series> s = {
      {"r", "a", "fps", "1/s", {{0, 1}, {1, 2}}},
      {"r", "a", "sleep", "ms", {{1, 5}}},
  };
  const std::string dir = FreshDir("misaligned");
  auto files = WriteCsv(dir, s);
  ASSERT_TRUE(files.ok());
  auto rows = ReadCsv((*files)[0]);
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[0], (std::vector<std::string>{"t_s", "a fps", "a sleep"}));
  EXPECT_EQ(rows[1], (std::vector<std::string>{"0", "1", ""}));
  EXPECT_EQ(rows[2], (std::vector<std::string>{"1", "2", "5"}));
}

TEST(OutputTest, NoSeriesIsAnError) {
  EXPECT_FALSE(WriteCsv(FreshDir("empty"), {}).ok());
}

TEST(OutputTest, UnwritableDirectoryIsAnError) {
  const std::string dir = FreshDir("file");
  fs::create_directories(fs::path(dir).parent_path());
  std::ofstream(dir) << "a file, not a directory";
  auto files = WriteCsv(dir + "/sub", TwoRuns());
  EXPECT_FALSE(files.ok());
  fs::remove(dir);
}

TEST(OutputTest, PlotsArePngsOnePerRun) {
  if (FindGnuplot().empty()) GTEST_SKIP() << "gnuplot is not installed";
  const std::string dir = FreshDir("plots");
  auto series = TwoRuns();
  series[0].run_label = "it's \"quoted\"";  // titles are escaped for gnuplot
  series[1].run_label = "it's \"quoted\"";
  auto files = WritePlots(dir, series);
  ASSERT_TRUE(files.ok()) << files.status().ToString();
  ASSERT_EQ(files->size(), 2u);
  for (const auto& f : *files) {
    std::ifstream in(f, std::ios::binary);
    char magic[8] = {};
    in.read(magic, 8);
    EXPECT_EQ(std::string(magic + 1, 3), "PNG") << f;
    EXPECT_GT(fs::file_size(f), 1000u) << f;
  }
}

}  // namespace
}  // namespace gmux::sim

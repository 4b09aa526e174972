// Helpers shared by the scenario tests of every kind.
#pragma once

#include <string>

#include <gtest/gtest.h>

#include "sim/scenario.h"

namespace gmux::sim {

inline Result<ScenarioOutput> RunText(const std::string& text,
                                      const std::string& path = "t.toml") {
  return RunScenarioText(text, path);
}

// The same text gives byte-identical JSON and table; replacing `seed_line` by `other_seed_line`
// changes the JSON (the seed matters).
inline void ExpectDeterministicInSeed(const std::string& text, const std::string& seed_line,
                                      const std::string& other_seed_line) {
  auto a = RunText(text);
  auto b = RunText(text);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ(a->json.dump(), b->json.dump());
  EXPECT_EQ(a->table, b->table);
  std::string other = text;
  size_t at = other.find(seed_line);
  ASSERT_NE(at, std::string::npos) << "no '" << seed_line << "' in the scenario text";
  other.replace(at, seed_line.size(), other_seed_line);
  auto c = RunText(other);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_NE(a->json.dump(), c->json.dump()) << "the seed must matter";
}

}  // namespace gmux::sim

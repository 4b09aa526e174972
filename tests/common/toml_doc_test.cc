#include "common/toml_doc.h"

#include <gtest/gtest.h>

namespace gmux {
namespace {

TEST(TomlDocTest, SyntaxErrorNamesFileAndLine) {
  auto doc = TomlDoc::Parse("a = 1\nb = = 2\n", "x.toml");
  ASSERT_FALSE(doc.ok());
  EXPECT_NE(doc.status().message().find("x.toml:2:"), std::string::npos)
      << doc.status().message();
}

TEST(TomlDocTest, WrongTypeNamesLineAndKey) {
  auto doc = TomlDoc::Parse("name = 'n'\n\nweight = 'heavy'\n", "y.toml");
  ASSERT_TRUE(doc.ok());
  auto w = doc->Number(doc->root(), "weight", 1.0, 0.0, 100.0);
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.status().message().find("y.toml:3: key 'weight'"), std::string::npos)
      << w.status().message();
}

TEST(TomlDocTest, RangeMissingAndUnknownKeys) {
  auto doc = TomlDoc::Parse("weight = -1\nextra = 2\n", "z.toml");
  ASSERT_TRUE(doc.ok());
  EXPECT_FALSE(doc->Number(doc->root(), "weight", 1.0, 0.0, 100.0).ok());
  EXPECT_FALSE(doc->Integer(doc->root(), "missing", std::nullopt).ok());
  EXPECT_EQ(*doc->Integer(doc->root(), "missing", 5), 5);
  Status s = doc->OnlyKeys(doc->root(), {"weight"});
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("z.toml:2: key 'extra'"), std::string::npos) << s.message();
}

TEST(TomlDocTest, ChoiceListsAlternatives) {
  auto doc = TomlDoc::Parse("policy = 'lottery'\n", "p.toml");
  ASSERT_TRUE(doc.ok());
  auto c = doc->Choice(doc->root(), "policy", std::nullopt, {"fifo", "credit"});
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("fifo, credit"), std::string::npos);
}

}  // namespace
}  // namespace gmux

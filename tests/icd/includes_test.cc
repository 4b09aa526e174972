// The ICD's resolution of a build's -I directories on the client (src/icd/includes.h), on real
// files in a temporary directory.
#include "icd/includes.h"

#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>

namespace gmux::icd {
namespace {

class IncludesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/gmux-icd-includes-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::system(("rm -rf '" + dir_ + "'").c_str()); }
  void Write(const std::string& name, const std::string& text) {
    std::string path = dir_ + "/" + name;
    for (size_t s = path.find('/', dir_.size() + 1); s != std::string::npos;
         s = path.find('/', s + 1)) {
      ::mkdir(path.substr(0, s).c_str(), 0700);
    }
    FILE* f = std::fopen(path.c_str(), "w");
    ASSERT_NE(f, nullptr) << path;
    std::fputs(text.c_str(), f);
    std::fclose(f);
  }
  static std::map<std::string, std::string> Files(const IncludeSet& s) {
    std::map<std::string, std::string> out;
    for (const auto& f : s.files) out[std::to_string(f.dir) + ":" + f.name] = f.data;
    return out;
  }
  std::string dir_;
};

TEST(IncludeNamesTest, QuotedAndAngledWithSpacingAndNothingElse) {
  auto n = IncludeNames(
      "#include \"a.h\"\n  #  include <b/c.h>\n#define X 1\n#include MACRO\n#include \"\"\n"
      "int x; // #include \"no.h\" is not at the line's start\n#include\t\"last.h\"");
  ASSERT_EQ(n.size(), 3u);
  EXPECT_EQ(n[0], "\"a.h");
  EXPECT_EQ(n[1], "<b/c.h");
  EXPECT_EQ(n[2], "\"last.h");
}

TEST(NormalizeRelativeTest, StaysBelowItsRoot) {
  EXPECT_EQ(NormalizeRelative("./a/./b//c.h"), "a/b/c.h");
  EXPECT_EQ(NormalizeRelative("a/../b.h"), "b.h");
  EXPECT_EQ(NormalizeRelative("../b.h"), "");
  EXPECT_EQ(NormalizeRelative("a/../../b.h"), "");
  EXPECT_EQ(NormalizeRelative("/etc/passwd"), "");
  EXPECT_EQ(NormalizeRelative(""), "");
}

TEST_F(IncludesTest, WithoutDashIOptionsAreUntouchedAndNothingIsRead) {
  auto s = CollectIncludes("-DX=1  -cl-fast-relaxed-math", {"#include \"a.h\""});
  EXPECT_EQ(s.options, "-DX=1  -cl-fast-relaxed-math");
  EXPECT_EQ(s.dirs, 0u);
  EXPECT_TRUE(s.files.empty());
}

TEST_F(IncludesTest, EveryDashIFormIsTakenOutInOrder) {
  Write("one/a.h", "A");
  Write("two words/b.h", "B");
  Write("three/c.h", "C");
  const std::string opts = "-DX=1 -I " + dir_ + "/one -I\"" + dir_ + "/two words\" -I" + dir_ +
                           "/three -cl-std=CL1.2";
  auto s = CollectIncludes(opts, {"#include \"a.h\"\n#include <b.h>\n#include \"c.h\"\n"});
  EXPECT_EQ(s.options, "-DX=1 -cl-std=CL1.2");
  EXPECT_EQ(s.dirs, 3u);
  auto f = Files(s);
  EXPECT_EQ(f.size(), 3u);
  EXPECT_EQ(f["0:a.h"], "A");
  EXPECT_EQ(f["1:b.h"], "B");
  EXPECT_EQ(f["2:c.h"], "C");
}

TEST_F(IncludesTest, SearchesAsTheCompilerDoes) {
  // The first directory that has a name wins; a quoted include in a header is looked up beside
  // that header first (far.h's "common.h" is second/common.h); headers include headers; a file
  // is sent once however often included.
  Write("first/common.h", "#include \"sub/deep.h\"\n#include \"common.h\"\n");
  Write("first/sub/deep.h", "#include \"near.h\"\n#include <far.h>\n");
  Write("first/sub/near.h", "near");
  Write("second/common.h", "shadowed");
  Write("second/far.h", "#include \"common.h\"\nfar");
  Write("second/sub/near.h", "never");
  auto s = CollectIncludes("-I" + dir_ + "/first -I" + dir_ + "/second",
                           {"#include \"common.h\"\n#include \"common.h\""});
  auto f = Files(s);
  EXPECT_EQ(f.size(), 5u);
  EXPECT_TRUE(f.count("0:common.h"));
  EXPECT_EQ(f["0:sub/deep.h"].substr(0, 8), "#include");
  EXPECT_EQ(f["0:sub/near.h"], "near");
  EXPECT_EQ(f["1:far.h"], "#include \"common.h\"\nfar");
  EXPECT_EQ(f["1:common.h"], "shadowed");
  EXPECT_FALSE(f.count("1:sub/near.h"));
}

TEST_F(IncludesTest, RelativeDirectoriesAreTheApplicationsAndNothingLeavesItsTree) {
  Write("app/main.h", "#include \"../secret.h\"\n#include \"/etc/hostname\"\n#include \"missing.h\"\n");
  Write("secret.h", "not sent");
  char cwd[4096];
  ASSERT_NE(::getcwd(cwd, sizeof(cwd)), nullptr);
  ASSERT_EQ(::chdir((dir_ + "/app").c_str()), 0);
  auto s = CollectIncludes("-I.", {"#include \"./main.h\""});
  ASSERT_EQ(::chdir(cwd), 0);
  ASSERT_EQ(s.files.size(), 1u);
  EXPECT_EQ(s.files[0].name, "main.h");
  EXPECT_EQ(s.options, "");
  EXPECT_EQ(s.dirs, 1u);
}

TEST_F(IncludesTest, OnlyRegularFilesAreHeaders) {
  Write("d/sub/x.h", "x");
  ASSERT_EQ(::mkfifo((dir_ + "/d/pipe.h").c_str(), 0600), 0);
  // A directory and a FIFO named like headers are not read (reading the FIFO would block).
  auto s = CollectIncludes("-I" + dir_ + "/d", {"#include \"sub\"\n#include \"pipe.h\"\n"
                                                "#include \"sub/x.h\""});
  ASSERT_EQ(s.files.size(), 1u);
  EXPECT_EQ(s.files[0].name, "sub/x.h");
}

TEST_F(IncludesTest, StopsAtItsBounds) {
  std::string src;
  for (size_t i = 0; i < kMaxIncludeFiles + 10; ++i) {
    Write("d/h" + std::to_string(i) + ".h", "x");
    src += "#include \"h" + std::to_string(i) + ".h\"\n";
  }
  auto s = CollectIncludes("-I" + dir_ + "/d", {src});
  EXPECT_EQ(s.files.size(), kMaxIncludeFiles);
}

}  // namespace
}  // namespace gmux::icd

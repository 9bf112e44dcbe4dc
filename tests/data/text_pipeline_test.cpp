// The text pipeline: the byte tokenizer, corpus loading and splitting, packed and padded
// batches checked against a stream rebuilt by hand, determinism and split invariance, and
// every rejected corpus.
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "harness/base/error.h"
#include "harness/data/text_pipeline.h"
#include "tests/support/temp_dir.h"

namespace mih::data {
namespace {

namespace fs = std::filesystem;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;
using ::testing::Matcher;
using Tok = ByteTokenizer;

// Matches a callable that throws mih::Error with `code` and a what() matching `message`.
auto ThrowsError(Code code, const Matcher<std::string>& message) {
  return ::testing::Throws<Error>(
      AllOf(::testing::Property(&Error::code, code),
            ::testing::ResultOf([](const Error& e) { return std::string(e.what()); }, message)));
}

void write(const fs::path& path, const std::string& text) {
  fs::create_directories(path.parent_path());
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
}

const std::string kLong = [] {
  std::string s;
  for (int i = 0; i < 6; ++i) s += "delta is a much longer document than the others, ";
  return s;
}();

// The documents of the test corpus in file order (a.txt, empty.txt, sub/b.txt, sub/link.txt
// -> a.txt, ws.txt), as the pipeline must split them.
const std::vector<std::string> kDocuments = {
    "alpha one\nalpha two", "beta", "gamma gamma gamma gamma gamma gamma",  // a.txt
    kLong, "epsilon",                                                       // sub/b.txt
    "alpha one\nalpha two", "beta", "gamma gamma gamma gamma gamma gamma",  // sub/link.txt
};

// A corpus with variable-length documents, blank lines of whitespace, an empty file, a
// whitespace-only file, a symlinked file and a symlink loop.
fs::path test_corpus() {
  static const fs::path dir = [] {
    auto d = mih::testing::temp_dir("text_corpus");
    write(d / "a.txt", "alpha one\nalpha two\n\nbeta\n\n\n  \ngamma gamma gamma gamma gamma gamma\n");
    write(d / "empty.txt", "");
    write(d / "sub" / "b.txt", kLong + "\n\t\nepsilon");
    write(d / "ws.txt", "\n \n\t\n");
    fs::create_symlink("../a.txt", d / "sub" / "link.txt");
    fs::create_directory_symlink("..", d / "sub" / "loop");
    return d;
  }();
  return dir;
}

// BOS + bytes + EOS of every document, in order: one pass of the unshuffled stream.
std::vector<int64_t> expected_stream() {
  std::vector<int64_t> stream;
  for (const auto& doc : kDocuments) {
    stream.push_back(Tok::kBos);
    for (int64_t t : Tok::encode(doc)) stream.push_back(t);
    stream.push_back(Tok::kEos);
  }
  return stream;
}

std::vector<int64_t> row(const at::Tensor& t, int64_t r) {
  auto c = t.select(0, r).contiguous();
  return {c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel()};
}

TextPipelineOptions corpus_options() { return TextPipelineOptions(test_corpus()).seq_len(16).global_batch(4); }

void expect_batches_equal(const Batch& a, const Batch& b) {
  EXPECT_TRUE(a.input_ids.equal(b.input_ids));
  EXPECT_TRUE(a.labels.equal(b.labels));
  EXPECT_TRUE(a.position_ids.equal(b.position_ids));
  ASSERT_EQ(a.fields.size(), b.fields.size());
  for (const auto& [name, tensor] : a.fields) EXPECT_TRUE(tensor.equal(b.fields.at(name))) << name;
}

TEST(ByteTokenizerTest, RoundTripsEveryByte) {
  std::string text;
  for (int b = 0; b < 256; ++b) text.push_back(static_cast<char>(b));
  text += "caf\xc3\xa9 \xe2\x82\xac";
  auto tokens = Tok::encode(text);
  ASSERT_EQ(tokens.size(), text.size());
  for (int b = 0; b < 256; ++b) EXPECT_EQ(tokens[b], b);
  EXPECT_EQ(Tok::decode(tokens), text);
  EXPECT_THAT(Tok::encode("hi"), ElementsAre('h', 'i'));
  EXPECT_EQ(Tok::kVocab, 259);
}

TEST(ByteTokenizerTest, DecodeSkipsSpecialsAndRejectsOutOfRange) {
  std::vector<int64_t> tokens = {Tok::kBos, 'o', 'k', Tok::kEos, Tok::kPad};
  EXPECT_EQ(Tok::decode(tokens), "ok");
  EXPECT_THAT([] { Tok::decode(std::vector<int64_t>{'a', Tok::kVocab}); },
              ThrowsError(Code::kInvalidSpec, AllOf(HasSubstr("token 1"), HasSubstr("got 259"))));
  EXPECT_THAT([] { Tok::decode(std::vector<int64_t>{-1}); }, ThrowsError(Code::kInvalidSpec, HasSubstr("got -1")));
}

TEST(TextPipelineTest, SplitsFilesIntoDocumentsAtBlankLines) {
  TextPipeline pipeline(corpus_options());
  EXPECT_EQ(pipeline.num_documents(), static_cast<int64_t>(kDocuments.size()));
  EXPECT_EQ(pipeline.num_tokens(), static_cast<int64_t>(expected_stream().size()));
  auto d = pipeline.describe();
  EXPECT_EQ(d.at("corpus"), test_corpus().string());
  EXPECT_EQ(d.at("documents"), kDocuments.size());
  EXPECT_EQ(d.at("vocab"), 259);
  EXPECT_EQ(d.at("options").at("seq_len"), 16);
  std::vector<std::string> paths;
  std::vector<int64_t> documents;
  for (const auto& f : d.at("files")) {
    paths.push_back(fs::path(f.at("path").get<std::string>()).lexically_relative(test_corpus()).string());
    documents.push_back(f.at("documents").get<int64_t>());
  }
  EXPECT_THAT(paths, ElementsAre("a.txt", "empty.txt", "sub/b.txt", "sub/link.txt", "ws.txt"));
  EXPECT_THAT(documents, ElementsAre(3, 0, 2, 3, 0));
}

TEST(TextPipelineTest, MinDocumentBytesDropsShortDocuments) {
  TextPipeline pipeline(corpus_options().min_document_bytes(8));  // drops "beta" twice and "epsilon"
  EXPECT_EQ(pipeline.num_documents(), static_cast<int64_t>(kDocuments.size()) - 3);
}

// max_document_bytes 7: each document cut into pieces of 7 bytes, the last one the rest, in
// order ("alpha one\nalpha two": "alpha o", "ne\nalph", "a two"); the unshuffled stream is
// the pieces as documents.
TEST(TextPipelineTest, MaxDocumentBytesCutsDocumentsIntoPieces) {
  TextPipeline pipeline(corpus_options().shuffle(false).max_document_bytes(7));
  std::vector<int64_t> stream;
  int64_t pieces = 0;
  for (const auto& doc : kDocuments) {
    for (size_t at = 0; at < doc.size(); at += 7, ++pieces) {
      stream.push_back(Tok::kBos);
      for (int64_t t : Tok::encode(doc.substr(at, 7))) stream.push_back(t);
      stream.push_back(Tok::kEos);
    }
  }
  EXPECT_EQ(pipeline.num_documents(), pieces);
  EXPECT_EQ(pipeline.num_tokens(), static_cast<int64_t>(stream.size()));
  const Batch batch = pipeline.batch(0);
  for (int64_t r = 0; r < 4; ++r) {
    EXPECT_THAT(row(batch.input_ids, r), ElementsAreArray(stream.begin() + r * 16, stream.begin() + r * 16 + 16));
  }
  EXPECT_THAT([] { TextPipeline(corpus_options().max_document_bytes(-1)); },
              ThrowsError(Code::kInvalidSpec, HasSubstr("'max_document_bytes' must be >= 0 (0: no limit), got -1")));
}

TEST(TextPipelineTest, PackedBatchesAreConsecutiveWindowsOfTheStream) {
  TextPipeline pipeline(corpus_options().shuffle(false));
  const auto stream = expected_stream();
  const auto n = static_cast<int64_t>(stream.size());
  const int64_t b = 4, s = 16;
  // Enough steps to wrap around the corpus several times.
  for (int64_t step = 0; step < 3 * n / (b * s) + 2; ++step) {
    Batch batch = pipeline.batch(step);
    ASSERT_THAT(batch.input_ids.sizes(), ElementsAre(b, s));
    for (int64_t r = 0; r < b; ++r) {
      SCOPED_TRACE(::testing::Message() << "step " << step << " row " << r);
      std::vector<int64_t> input(s), labels(s), positions(s);
      const int64_t start = (step * b + r) * s;
      for (int64_t t = 0; t < s; ++t) {
        input[t] = stream[(start + t) % n];
        const int64_t next = stream[(start + t + 1) % n];
        labels[t] = next == Tok::kBos ? kIgnoreIndex : next;
        positions[t] = (t == 0 || input[t] == Tok::kBos) ? 0 : positions[t - 1] + 1;
      }
      EXPECT_THAT(row(batch.input_ids, r), ElementsAreArray(input));
      EXPECT_THAT(row(batch.labels, r), ElementsAreArray(labels));
      EXPECT_THAT(row(batch.position_ids, r), ElementsAreArray(positions));
    }
  }
}

TEST(TextPipelineTest, PackedLabelsAreTheNextInputShiftedOnce) {
  TextPipeline pipeline(corpus_options());  // shuffled
  const int64_t b = 4, s = 16;
  int64_t checked = 0;
  for (int64_t step = 0; step < 20; ++step) {
    Batch batch = pipeline.batch(step);
    Batch next = pipeline.batch(step + 1);
    ASSERT_EQ(batch.labels.scalar_type(), at::kLong);
    EXPECT_FALSE(batch.labels.equal(batch.input_ids));
    for (int64_t r = 0; r < b; ++r) {
      auto input = row(batch.input_ids, r), labels = row(batch.labels, r);
      // The token after the row: the next row's first, or the next step's first row's.
      const int64_t after = r + 1 < b ? row(batch.input_ids, r + 1)[0] : row(next.input_ids, 0)[0];
      for (int64_t t = 0; t < s; ++t) {
        const int64_t target = t + 1 < s ? input[t + 1] : after;
        if (labels[t] == kIgnoreIndex) {
          EXPECT_EQ(target, Tok::kBos) << "step " << step << " row " << r << " t " << t;
        } else {
          EXPECT_EQ(labels[t], target) << "step " << step << " row " << r << " t " << t;
          ++checked;
        }
      }
    }
  }
  EXPECT_GT(checked, 0);
}

TEST(TextPipelineTest, PackedMasksAndPositionsRestartAtEachDocument) {
  TextPipeline pipeline(corpus_options());
  int64_t restarts_inside_rows = 0;
  for (int64_t step = 0; step < 20; ++step) {
    Batch batch = pipeline.batch(step);
    const auto& loss_mask = batch.fields.at("loss_mask");
    const auto& attention_mask = batch.fields.at("attention_mask");
    ASSERT_EQ(loss_mask.scalar_type(), at::kLong);
    ASSERT_THAT(loss_mask.sizes(), ElementsAre(4, 16));
    ASSERT_THAT(attention_mask.sizes(), ElementsAre(4, 16));
    EXPECT_TRUE(attention_mask.eq(1).all().item<bool>());
    EXPECT_TRUE(loss_mask.eq(batch.labels.ne(kIgnoreIndex)).all().item<bool>());
    // Every BOS of the stream follows an EOS: the masked targets are exactly after an EOS.
    EXPECT_TRUE(loss_mask.eq(0).eq(batch.input_ids.eq(Tok::kEos)).all().item<bool>());
    for (int64_t r = 0; r < 4; ++r) {
      auto input = row(batch.input_ids, r), positions = row(batch.position_ids, r);
      EXPECT_EQ(positions[0], 0);
      for (int64_t t = 1; t < 16; ++t) {
        if (input[t] == Tok::kBos) {
          EXPECT_EQ(positions[t], 0);
          ++restarts_inside_rows;
        } else {
          EXPECT_EQ(positions[t], positions[t - 1] + 1);
        }
      }
    }
  }
  EXPECT_GT(restarts_inside_rows, 0);
}

// document_ids: 0 at the row's start, one more at every BOS input after it, so a position
// restarts exactly where the document changes and no label crosses a change; the other fields
// are those of the batch without the option.
TEST(TextPipelineTest, DocumentIdsCountTheDocumentsOfEachRow) {
  TextPipeline plain(corpus_options()), with_ids(corpus_options().document_ids(true));
  int64_t changes = 0;
  for (int64_t step = 0; step < 20; ++step) {
    Batch batch = with_ids.batch(step), without = plain.batch(step);
    ASSERT_EQ(batch.fields.count(kDocumentIdsField), 1u);
    const at::Tensor docs = batch.fields.at(kDocumentIdsField);
    EXPECT_EQ(docs.scalar_type(), at::kLong);
    EXPECT_EQ(batch.provenance->document_field, kDocumentIdsField);
    batch.fields.erase(kDocumentIdsField);
    expect_batches_equal(batch, without);
    for (int64_t r = 0; r < 4; ++r) {
      auto input = row(batch.input_ids, r), positions = row(batch.position_ids, r), ids = row(docs, r);
      auto labels = row(batch.labels, r);
      EXPECT_EQ(ids[0], 0);
      EXPECT_EQ(ids.back() + 1, static_cast<int64_t>(batch.provenance->rows[r].size()) -
                                    (batch.provenance->rows[r].back().offset == 0 &&
                                     batch.provenance->rows[r].back().length == 1 ? 1 : 0));
      for (int64_t t = 1; t < 16; ++t) {
        const bool starts = input[t] == Tok::kBos;
        EXPECT_EQ(ids[t], ids[t - 1] + (starts ? 1 : 0)) << "step " << step << " row " << r << " t " << t;
        EXPECT_EQ(positions[t] == 0, starts);
        if (starts) {
          EXPECT_EQ(labels[t - 1], kIgnoreIndex);  // no loss on predicting the next document's BOS
          ++changes;
        }
      }
    }
  }
  EXPECT_GT(changes, 0);
  EXPECT_THAT([] { TextPipeline(corpus_options().packing(false).document_ids(true)); },
              ThrowsError(Code::kInvalidSpec, HasSubstr("'document_ids' numbers the documents of a packed row")));
}

TEST(TextPipelineTest, PaddedRowsHoldOneDocumentEach) {
  const int64_t b = 3, s = 24;  // kLong is truncated, the others padded
  TextPipeline pipeline(corpus_options().packing(false).shuffle(false).global_batch(b).seq_len(s));
  const auto d = static_cast<int64_t>(kDocuments.size());
  int64_t padded = 0, truncated = 0;
  for (int64_t step = 0; step < 7; ++step) {
    Batch batch = pipeline.batch(step);
    const auto& loss_mask = batch.fields.at("loss_mask");
    const auto& attention_mask = batch.fields.at("attention_mask");
    EXPECT_TRUE(attention_mask.eq(batch.input_ids.ne(Tok::kPad)).all().item<bool>());
    EXPECT_TRUE(loss_mask.eq(batch.labels.ne(kIgnoreIndex)).all().item<bool>());
    for (int64_t r = 0; r < b; ++r) {
      SCOPED_TRACE(::testing::Message() << "step " << step << " row " << r);
      const std::string& doc = kDocuments[(step * b + r) % d];
      std::vector<int64_t> tokens = {Tok::kBos};
      for (int64_t t : Tok::encode(doc)) tokens.push_back(t);
      tokens.push_back(Tok::kEos);
      if (static_cast<int64_t>(tokens.size()) > s + 1) ++truncated;
      if (static_cast<int64_t>(tokens.size()) < s + 1) ++padded;
      tokens.resize(s + 1, Tok::kPad);
      std::vector<int64_t> input(tokens.begin(), tokens.begin() + s), labels(s), positions(s);
      for (int64_t t = 0; t < s; ++t) {
        labels[t] = tokens[t + 1] == Tok::kPad ? kIgnoreIndex : tokens[t + 1];
        positions[t] = t;
      }
      EXPECT_THAT(row(batch.input_ids, r), ElementsAreArray(input));
      EXPECT_THAT(row(batch.labels, r), ElementsAreArray(labels));
      EXPECT_THAT(row(batch.position_ids, r), ElementsAreArray(positions));
      EXPECT_EQ(Tok::decode(row(batch.input_ids, r)), doc.substr(0, s - 1));
    }
  }
  EXPECT_GT(padded, 0);
  EXPECT_GT(truncated, 0);
}

TEST(TextPipelineTest, IsDeterministicPerStep) {
  for (bool packing : {true, false}) {
    SCOPED_TRACE(packing ? "packing" : "padding");
    auto options = corpus_options().packing(packing);
    TextPipeline a(options), b(options);
    for (int64_t step : {0, 1, 5, 37}) expect_batches_equal(a.batch(step), b.batch(step));
    EXPECT_FALSE(a.batch(0).input_ids.equal(a.batch(1).input_ids));
    BatchSource source = a.source();
    BatchSource copy = source;
    expect_batches_equal(copy(3), b.batch(3));
  }
}

TEST(TextPipelineTest, SeedChangesTheDocumentOrder) {
  auto options = corpus_options().packing(false).global_batch(8);
  TextPipeline a(options), b(TextPipelineOptions(options).seed(1)), unshuffled(TextPipelineOptions(options).shuffle(false));
  bool seed_differs = false, shuffle_differs = false;
  for (int64_t step = 0; step < 4; ++step) {
    seed_differs |= !a.batch(step).input_ids.equal(b.batch(step).input_ids);
    shuffle_differs |= !a.batch(step).input_ids.equal(unshuffled.batch(step).input_ids);
  }
  EXPECT_TRUE(seed_differs);
  EXPECT_TRUE(shuffle_differs);
}

TEST(TextPipelineTest, EveryDocumentAppearsOncePerPass) {
  // Padding mode, one pass = num_documents rows: each document exactly once, shuffled.
  auto options = corpus_options().packing(false).global_batch(static_cast<int64_t>(kDocuments.size())).seq_len(400);
  TextPipeline pipeline(options);
  for (int64_t step = 0; step < 3; ++step) {
    std::vector<std::string> seen;
    Batch batch = pipeline.batch(step);
    for (int64_t r = 0; r < batch.input_ids.size(0); ++r) seen.push_back(Tok::decode(row(batch.input_ids, r)));
    EXPECT_THAT(seen, ::testing::UnorderedElementsAreArray(kDocuments)) << "pass " << step;
  }
}

TEST(TextPipelineTest, SplittingTheGlobalBatchGivesTheSameRows) {
  for (bool packing : {true, false}) {
    SCOPED_TRACE(packing ? "packing" : "padding");
    TextPipeline global(corpus_options().packing(packing).global_batch(8));
    TextPipeline half(corpus_options().packing(packing).global_batch(4));
    for (int64_t step = 0; step < 6; ++step) {
      Batch full = global.batch(step);
      // Two ranks each taking half of the global batch see the halves of one batch...
      for (int64_t part = 0; part < 2; ++part) {
        Batch again = global.batch(step);
        EXPECT_TRUE(again.input_ids.narrow(0, part * 4, 4).equal(full.input_ids.narrow(0, part * 4, 4)));
        EXPECT_TRUE(again.labels.narrow(0, part * 4, 4).equal(full.labels.narrow(0, part * 4, 4)));
      }
      // ...and a global batch of 8 is two consecutive global batches of 4: rows are numbered
      // step * B + r, nothing else.
      Batch first = half.batch(2 * step), second = half.batch(2 * step + 1);
      EXPECT_TRUE(at::cat({first.input_ids, second.input_ids}).equal(full.input_ids));
      EXPECT_TRUE(at::cat({first.labels, second.labels}).equal(full.labels));
      EXPECT_TRUE(at::cat({first.position_ids, second.position_ids}).equal(full.position_ids));
      EXPECT_TRUE(at::cat({first.fields.at("loss_mask"), second.fields.at("loss_mask")}).equal(full.fields.at("loss_mask")));
    }
  }
}

TEST(TextPipelineTest, DependsOnlyOnTheStep) {
  // Steps asked in another order, from several threads, by copies: the same batches.
  TextPipeline pipeline(corpus_options());
  std::vector<Batch> in_order;
  for (int64_t step = 0; step < 12; ++step) in_order.push_back(pipeline.batch(step));
  std::vector<Batch> concurrent(12);
  std::vector<std::thread> threads;
  for (int w = 0; w < 3; ++w) {
    threads.emplace_back([&, w, source = pipeline.source()] {
      for (int64_t step = 11 - w; step >= 0; step -= 3) concurrent[step] = source(step);
    });
  }
  for (auto& t : threads) t.join();
  for (int64_t step = 0; step < 12; ++step) {
    SCOPED_TRACE(step);
    expect_batches_equal(concurrent[step], in_order[step]);
  }
}

TEST(TextPipelineTest, ReadsTheSystemCorpus) {
  TextPipelineOptions options;
  if (!fs::is_directory(options.corpus())) GTEST_SKIP() << options.corpus() << " is not installed";
  TextPipeline pipeline(options);
  EXPECT_GT(pipeline.num_documents(), 100);
  EXPECT_GT(pipeline.num_tokens(), 10000);
  Batch batch = pipeline.batch(0);
  EXPECT_THAT(batch.input_ids.sizes(), ElementsAre(8, 128));
  EXPECT_THAT(batch.labels.sizes(), ElementsAre(8, 128));
  EXPECT_EQ(batch.input_ids.scalar_type(), at::kLong);
  EXPECT_EQ(batch.position_ids.scalar_type(), at::kLong);
  EXPECT_TRUE(batch.input_ids.ge(0).all().item<bool>());
  EXPECT_TRUE(batch.input_ids.lt(Tok::kVocab).all().item<bool>());
  // Document lengths vary: padded rows carry different numbers of PAD.
  TextPipeline padded(TextPipelineOptions().packing(false).global_batch(32));
  auto pads = padded.batch(0).input_ids.eq(Tok::kPad).sum(1);
  EXPECT_GT(pads.max().item<int64_t>(), pads.min().item<int64_t>());
}

TEST(TextPipelineTest, OptionsRoundTripThroughJson) {
  auto options = corpus_options().packing(false).seed(7).min_document_bytes(3);
  nlohmann::json j = options;
  EXPECT_EQ(nlohmann::json(corpus_options().document_ids(true)).get<TextPipelineOptions>().document_ids(), true);
  EXPECT_EQ(nlohmann::json(corpus_options().max_document_bytes(9)).get<TextPipelineOptions>().max_document_bytes(), 9);
  auto back = j.get<TextPipelineOptions>();
  EXPECT_EQ(nlohmann::json(back), j);
  EXPECT_EQ(::testing::PrintToString(options), j.dump());
  EXPECT_THAT(([] { nlohmann::json({{"seqlen", 3}}).get<TextPipelineOptions>(); }),
              ThrowsError(Code::kInvalidSpec, AllOf(HasSubstr("unknown field 'seqlen'"), HasSubstr("seq_len"))));
}

TEST(TextPipelineTest, RejectsBadOptionsAndSteps) {
  EXPECT_THAT([] { TextPipeline(corpus_options().seq_len(0)); },
              ThrowsError(Code::kInvalidSpec, HasSubstr("'seq_len' must be >= 1, got 0")));
  EXPECT_THAT([] { TextPipeline(corpus_options().global_batch(-2)); },
              ThrowsError(Code::kInvalidSpec, HasSubstr("'global_batch' must be >= 1, got -2")));
  EXPECT_THAT([] { TextPipeline(corpus_options()).batch(-1); },
              ThrowsError(Code::kInvalidSpec, HasSubstr("step must be >= 0, got -1")));
}

TEST(TextPipelineTest, RejectsMissingCorpus) {
  auto missing = mih::testing::temp_dir("missing_corpus") / "nope";
  EXPECT_THAT([&] { TextPipeline{TextPipelineOptions(missing)}; },
              ThrowsError(Code::kFailedPrecondition, AllOf(HasSubstr("'" + missing.string() + "' does not exist"),
                                                           HasSubstr("pass --corpus DIR with text files"))));
}

TEST(TextPipelineTest, RejectsEmptyCorpus) {
  auto empty = mih::testing::temp_dir("empty_corpus");
  EXPECT_THAT([&] { TextPipeline{TextPipelineOptions(empty)}; },
              ThrowsError(Code::kFailedPrecondition, AllOf(HasSubstr(empty.string()), HasSubstr("no regular file"),
                                                           HasSubstr("pass --corpus DIR"))));
  write(empty / "blank.txt", "\n\n  \n");
  write(empty / "nothing.txt", "");
  EXPECT_THAT([&] { TextPipeline{TextPipelineOptions(empty)}; },
              ThrowsError(Code::kFailedPrecondition,
                          AllOf(HasSubstr(empty.string()), HasSubstr("holds no document"), HasSubstr("2 file(s)"))));
}

TEST(TextPipelineTest, RejectsCorpusThatIsAFile) {
  auto file = mih::testing::temp_dir("file_corpus") / "corpus.txt";
  write(file, "some text\n");
  EXPECT_THAT([&] { TextPipeline{TextPipelineOptions(file)}; },
              ThrowsError(Code::kFailedPrecondition, AllOf(HasSubstr("'" + file.string() + "' is not a directory"),
                                                           HasSubstr("pass --corpus DIR"))));
}

TEST(TextPipelineTest, RejectsUnreadableFile) {
  if (::geteuid() == 0) GTEST_SKIP() << "running as root, which reads a chmod 000 file";
  auto dir = mih::testing::temp_dir("unreadable_corpus");
  write(dir / "ok.txt", "fine\n");
  write(dir / "secret.txt", "hidden\n");
  ASSERT_EQ(::chmod((dir / "secret.txt").c_str(), 0), 0);
  EXPECT_THAT([&] { TextPipeline{TextPipelineOptions(dir)}; },
              ThrowsError(Code::kFailedPrecondition,
                          AllOf(HasSubstr("cannot read corpus file '" + (dir / "secret.txt").string() + "'"),
                                HasSubstr("Permission denied"))));
  ::chmod((dir / "secret.txt").c_str(), 0644);
}

}  // namespace
}  // namespace mih::data

// checks::check_batch_documents on the reference specs' real pipelines: every field of the text
// pipeline's packed and padded batches, and the vlm's placeholders, recomputed from the raw
// documents, match; a pipeline bug that the reference would share (so the comparison with it
// passes, and so does today's data contract) is named with its field, row and position.
#include <map>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "harness/checks/checks.h"
#include "harness/data/text_pipeline.h"
#include "harness/findings/codes.h"
#include "harness/spec/model_spec.h"

namespace mih {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

std::vector<std::string> errors(const FindingReport& r) {
  std::vector<std::string> out;
  for (const auto& f : r.findings()) out.push_back(f.code + " " + f.owner + ": " + f.message);
  return out;
}

spec::ModelSpec get(const std::string& name) { return spec::SpecRegistry::instance().get(name); }

TEST(BatchDocumentsTest, ReferencePipelinesMatchTheirDocuments) {
  for (const char* name : {"llama", "moe", "vlm", "llama_docs", "qwen3_docs"}) {
    const spec::ModelSpec s = get(name);
    ASSERT_TRUE(s.data.rows_from_documents) << name;
    const BatchSource batches = s.data.make_batches();
    for (int64_t step = 0; step < 4; ++step) {
      const Batch b = batches(step);
      const checks::CheckOutput out = checks::check_batch_documents(s.data, b);
      EXPECT_THAT(errors(out.findings), IsEmpty()) << name << " step " << step;
      ASSERT_EQ(out.findings.runs().size(), 1u);
      EXPECT_EQ(out.findings.runs()[0].examined, b.input_ids.numel());
    }
  }
  // Padded rows, and rows far into the stream (past the first pass over the corpus).
  spec::DataSpec data;
  data.rows_from_documents = true;
  for (bool packing : {true, false}) {
    const data::TextPipeline text(data::TextPipelineOptions().seq_len(32).global_batch(6).packing(packing));
    for (int64_t step : {0, 1, 2000}) {
      EXPECT_THAT(errors(checks::check_batch_documents(data, text.batch(step)).findings), IsEmpty())
          << (packing ? "packed" : "padded") << " step " << step;
    }
  }
}

// The vlm's rows: the first P inputs are image placeholders; a document start they cover is no
// boundary, so the text after them counts on from P.
TEST(BatchDocumentsTest, VlmPlaceholdersAreRecomputed) {
  const spec::ModelSpec s = get("vlm");
  const Batch b = s.data.make_batches()(0);
  ASSERT_TRUE(b.provenance);
  const int64_t p = b.provenance->prefix_tokens;
  ASSERT_GT(p, 0);
  EXPECT_EQ(b.provenance->prefix_index_field, "image_token_index");
  Batch wrong = b;
  wrong.fields["image_token_index"] = b.fields.at("image_token_index").clone();
  wrong.fields["image_token_index"][3][1] = 2;  // patch 2 twice, patch 1 never
  const FindingReport r = checks::check_batch_documents(s.data, wrong).findings;
  EXPECT_THAT(errors(r), ::testing::ElementsAre(HasSubstr(
                             "MIH-DATA-009 image_token_index: field 'image_token_index' differs from its recomputation "
                             "from the raw documents at 1 of 512 positions; first at row 3, position 1: recomputed 1, "
                             "the pipeline gave 2")));
}

// Planted pipeline bugs that the reference shares: today's data contract passes each (the
// labels are still the next input wherever they are valid), the recomputation names it.
TEST(BatchDocumentsTest, CatchesPipelineBugsTheReferenceShares) {
  const spec::ModelSpec s = get("llama");
  const Batch good = s.data.make_batches()(0);
  const int64_t rows = good.input_ids.size(0), seq = good.input_ids.size(1);
  // The first document start inside a row (not at its position 0), and its row.
  int64_t row = -1, start = -1;
  for (int64_t r = 0; r < rows && row < 0; ++r) {
    for (int64_t t = 1; t < seq; ++t) {
      if (good.input_ids[r][t].item<int64_t>() == data::ByteTokenizer::kBos) {
        row = r;
        start = t;
        break;
      }
    }
  }
  ASSERT_GE(row, 0) << "no document starts inside a row of step 0";

  // 1. Positions that never restart: every row counts 0..S-1 across its documents.
  Batch positions = good;
  positions.position_ids = at::arange(seq, at::kLong).unsqueeze(0).expand({rows, seq}).contiguous();
  // 2. A label that crosses the boundary: the input before the document start (its EOS) is
  //    trained to predict the next document's BOS, with a loss_mask to match.
  Batch labels = good;
  labels.labels = good.labels.clone();
  labels.fields["loss_mask"] = good.fields.at("loss_mask").clone();
  labels.labels[row][start - 1] = data::ByteTokenizer::kBos;
  labels.fields["loss_mask"][row][start - 1] = 1;

  for (const Batch* planted : {&positions, &labels}) {
    // Today's contract (owners, produced fields, the labels' shift) sees nothing wrong.
    EXPECT_THAT(errors(checks::check_data_contract(s.data, *planted).findings), IsEmpty());
  }
  const std::string at = "first at row " + std::to_string(row) + ", position " + std::to_string(start) +
                         ": recomputed 0, the pipeline gave " + std::to_string(start);
  const FindingReport p = checks::check_batch_documents(s.data, positions).findings;
  EXPECT_THAT(errors(p), ::testing::ElementsAre(AllOf(HasSubstr("MIH-DATA-009 position_ids: field 'position_ids' "
                                                                "differs from its recomputation from the raw documents"),
                                                      HasSubstr(at), HasSubstr("(the row holds document "))));
  const FindingReport l = checks::check_batch_documents(s.data, labels).findings;
  const std::string label_at = "first at row " + std::to_string(row) + ", position " + std::to_string(start - 1);
  EXPECT_THAT(errors(l),
              ::testing::ElementsAre(
                  AllOf(HasSubstr("MIH-DATA-009 labels: field 'labels' differs"), HasSubstr("at 1 of 512 positions"),
                        HasSubstr(label_at + ": recomputed -100, the pipeline gave 256")),
                  AllOf(HasSubstr("MIH-DATA-009 loss_mask"), HasSubstr(label_at + ": recomputed 0, the pipeline gave 1"))));
  EXPECT_EQ(l.findings()[0].remediation.find("label each input with the next token of its own document"), 0u);

  // A window that skips tokens (a span ending inside its document) cannot be the row.
  Batch skipped = good;
  auto provenance = std::make_shared<BatchProvenance>(*good.provenance);
  provenance->rows[static_cast<size_t>(row)][0].length -= 1;
  provenance->rows[static_cast<size_t>(row)][1].length += 1;
  skipped.provenance = provenance;
  EXPECT_THAT(errors(checks::check_batch_documents(s.data, skipped).findings),
              ::testing::ElementsAre(AllOf(HasSubstr("row " + std::to_string(row) + " cannot be rebuilt from its provenance"),
                                           HasSubstr("ends inside its document"))));

  // Declared, but the pipeline attaches nothing.
  Batch bare = good;
  bare.provenance = nullptr;
  EXPECT_THAT(errors(checks::check_batch_documents(s.data, bare).findings),
              ::testing::ElementsAre(HasSubstr("declares rows_from_documents, but the pipeline's batch carries no provenance")));
  // Not declared: the check does not run (a synthetic pipeline has no documents).
  spec::DataSpec synthetic = s.data;
  synthetic.rows_from_documents = false;
  EXPECT_TRUE(checks::check_batch_documents(synthetic, bare).findings.runs().empty());
}

// A document field recomputed from the spans: the pipeline's passes; ids numbered per cp shard
// (each half of the row counting its documents from 0, as a rank that derives them from its
// own tokens does) or one that never counts a document start are named; a field the
// provenance names but the batch lacks too.
TEST(BatchDocumentsTest, DocumentIdsAreRecomputedFromTheSpans) {
  spec::DataSpec data;
  data.rows_from_documents = true;
  const data::TextPipeline text(data::TextPipelineOptions().seq_len(64).global_batch(8).document_ids(true));
  for (int64_t step : {0, 1, 2000}) {
    EXPECT_THAT(errors(checks::check_batch_documents(data, text.batch(step)).findings), IsEmpty()) << "step " << step;
  }
  const Batch good = text.batch(0);
  const at::Tensor ids = good.fields.at(data::kDocumentIdsField);
  Batch per_shard = good;
  per_shard.fields[data::kDocumentIdsField] =
      at::cat({ids.narrow(1, 0, 32), ids.narrow(1, 32, 32) - ids.narrow(1, 32, 1)}, 1);
  ASSERT_FALSE(per_shard.fields[data::kDocumentIdsField].equal(ids)) << "no document starts before the row's middle";
  EXPECT_THAT(errors(checks::check_batch_documents(data, per_shard).findings),
              ::testing::ElementsAre(AllOf(HasSubstr("MIH-DATA-009 document_ids: field 'document_ids' differs from "
                                                     "its recomputation from the raw documents"),
                                           HasSubstr("position 32: recomputed"))));
  Batch one_document = good;
  one_document.fields[data::kDocumentIdsField] = at::zeros_like(ids);
  const FindingReport r = checks::check_batch_documents(data, one_document).findings;
  ASSERT_THAT(errors(r), ::testing::ElementsAre(HasSubstr("MIH-DATA-009 document_ids")));
  EXPECT_THAT(r.findings()[0].why_unsafe, HasSubstr("two documents share an id"));
  Batch missing = good;
  missing.fields.erase(data::kDocumentIdsField);
  EXPECT_THAT(errors(checks::check_batch_documents(data, missing).findings),
              ::testing::ElementsAre(HasSubstr("the provenance names document field 'document_ids', which the batch "
                                               "does not hold")));
}

// The document specs' first batch holds what their cases must be exact on: several documents
// to a row, documents of odd length, and documents that straddle a chunk boundary of cp 2 contiguous (token 32 of 64) and
// of cp 2 zigzag (tokens 16, 32, 48), so a mask looked up at a rank's local ids leaks.
TEST(BatchDocumentsTest, DocumentSpecsStraddleTheCpChunkBoundaries) {
  for (const char* name : {"llama_docs", "qwen3_docs"}) {
    const spec::ModelSpec s = get(name);
    const Batch b = s.data.make_batches()(0);
    ASSERT_EQ(b.fields.count(data::kDocumentIdsField), 1u) << name;
    const at::Tensor ids = b.fields.at(data::kDocumentIdsField);
    const int64_t seq = ids.size(1);
    ASSERT_EQ(seq, 64) << name;
    std::map<int64_t, int64_t> straddling;  // boundary -> rows with one document on both sides
    for (int64_t boundary : {16, 32, 48}) {
      straddling[boundary] = ids.select(1, boundary - 1).eq(ids.select(1, boundary)).sum().item<int64_t>();
      EXPECT_GT(straddling[boundary], 0) << name << ": no document straddles token " << boundary;
    }
    int64_t odd = 0, starts = 0;
    for (const auto& row : b.provenance->rows) {
      for (const auto& span : row) {
        odd += static_cast<int64_t>(b.provenance->document_bytes(span.document).size() + 2) % 2;
        starts += span.offset == 0 ? 1 : 0;
      }
    }
    EXPECT_GT(odd, 0) << name << ": no document of odd length";
    EXPECT_GE(starts, 2 * static_cast<int64_t>(b.provenance->rows.size())) << name << ": rows of one or two documents";
    const auto sharding = s.data.apply_sharding(TrainerOptions()).cp_replicated_fields();
    EXPECT_THAT(sharding, ::testing::Contains(std::string(data::kDocumentIdsField))) << name;
  }
}

}  // namespace
}  // namespace mih

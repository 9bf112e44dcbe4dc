// ByteTokenizer and TextPipeline: loading a text corpus and cutting it into
// packed or padded global batches.
#include "harness/data/text_pipeline.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <ostream>
#include <set>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "harness/base/error.h"
#include "harness/base/fault.h"
#include "harness/base/json_fields.h"
#include "harness/data/data_files.h"

namespace mih::data {

namespace fs = std::filesystem;

namespace internal {

struct TextFile {
  fs::path path;
  int64_t bytes = 0;
  int64_t documents = 0;
};

// Documents are stored back to back in `bytes`; document d is
// bytes[doc_begin[d], doc_begin[d] + doc_bytes[d]) and BOS + those bytes + EOS as tokens.
struct TextCorpus {
  fs::path root;
  std::vector<TextFile> files;
  std::string bytes;
  std::vector<int64_t> doc_begin;
  std::vector<int64_t> doc_bytes;
  int64_t tokens = 0;

  int64_t num_documents() const { return static_cast<int64_t>(doc_begin.size()); }
  int64_t doc_tokens(int64_t d) const { return doc_bytes[d] + 2; }
  // Token j (0 <= j < doc_tokens(d)) of document d.
  int64_t token(int64_t d, int64_t j) const {
    if (j == 0) return ByteTokenizer::kBos;
    if (j == doc_bytes[d] + 1) return ByteTokenizer::kEos;
    return static_cast<unsigned char>(bytes[static_cast<size_t>(doc_begin[d] + j - 1)]);
  }
};

}  // namespace internal

namespace {

using internal::TextCorpus;

constexpr std::string_view kCorpusFix = "pass --corpus DIR with text files";

// splitmix64 (Steele, Lea, Flood 2014; the reference constants of Vigna's splitmix64.c):
// fully specified, unlike std::shuffle and the std distributions, so the document order is
// the same with every standard library.
uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// Uniform in [0, n) without modulo bias (rejection of the low remainder).
uint64_t uniform_below(uint64_t& state, uint64_t n) {
  const uint64_t threshold = (0 - n) % n;
  for (;;) {
    uint64_t r = splitmix64(state);
    if (r >= threshold) return r % n;
  }
}

// 0 .. n-1 in the order of round `round` of seed `seed`: a Fisher-Yates shuffle driven by
// splitmix64 (identity without shuffle). A pass's document order and an epoch's sample order.
std::vector<int64_t> shuffled_order(int64_t n, uint64_t seed, int64_t round, bool shuffle) {
  std::vector<int64_t> order(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) order[i] = i;
  if (!shuffle) return order;
  uint64_t state = seed;
  state = splitmix64(state) ^ static_cast<uint64_t>(round);
  for (int64_t i = n - 1; i > 0; --i) {
    auto j = static_cast<int64_t>(uniform_below(state, static_cast<uint64_t>(i + 1)));
    std::swap(order[i], order[j]);
  }
  return order;
}

// The document order of one pass and where each document starts in the pass's token stream.
struct Pass {
  int64_t index = -1;
  std::vector<int64_t> order;
  std::vector<int64_t> start;  // size D + 1; start[i] = tokens of order[0..i)
};

// Computes passes on demand, keeping the last one: a batch touches one or two passes.
class PassCache {
 public:
  PassCache(const TextCorpus& corpus, const TextPipelineOptions& options) : corpus_(corpus), options_(options) {}

  const Pass& get(int64_t index) {
    if (pass_.index == index) return pass_;
    const int64_t d = corpus_.num_documents();
    pass_.index = index;
    pass_.order = shuffled_order(d, options_.seed(), index, options_.shuffle());
    pass_.start.assign(static_cast<size_t>(d + 1), 0);
    for (int64_t i = 0; i < d; ++i) pass_.start[i + 1] = pass_.start[i] + corpus_.doc_tokens(pass_.order[i]);
    return pass_;
  }

 private:
  const TextCorpus& corpus_;
  const TextPipelineOptions& options_;
  Pass pass_;
};

bool is_blank(std::string_view line) {
  return line.find_first_not_of(" \t\r\f\v") == std::string_view::npos;
}

std::string read_text_file(const fs::path& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  MIH_CHECK_CODE(f != nullptr, Code::kFailedPrecondition, "cannot read corpus file '", path.string(),
                 "': ", std::strerror(errno), "; make it readable or ", kCorpusFix);
  std::string contents;
  char buffer[1 << 16];
  size_t n = 0;
  while ((n = std::fread(buffer, 1, sizeof(buffer), f)) > 0) contents.append(buffer, n);
  const bool failed = std::ferror(f) != 0;
  const int err = errno;
  std::fclose(f);
  MIH_CHECK_CODE(!failed, Code::kFailedPrecondition, "cannot read corpus file '", path.string(),
                 "': ", std::strerror(err), "; make it readable or ", kCorpusFix);
  return contents;
}

// Appends one document of `len` bytes (already in corpus.bytes from `begin`).
void add_document(int64_t begin, int64_t len, TextCorpus& corpus) {
  corpus.doc_begin.push_back(begin);
  corpus.doc_bytes.push_back(len);
  corpus.tokens += len + 2;
}

// Appends the documents of `text` (split at blank lines, those above max_bytes > 0 cut into
// pieces of max_bytes) to the corpus; returns how many.
int64_t add_documents(std::string_view text, int64_t min_bytes, int64_t max_bytes, TextCorpus& corpus) {
  int64_t added = 0;
  size_t doc_start = std::string_view::npos;
  size_t doc_end = 0;
  auto flush = [&] {
    if (doc_start == std::string_view::npos) return;
    const auto len = static_cast<int64_t>(doc_end - doc_start);
    if (len >= min_bytes) {
      const auto begin = static_cast<int64_t>(corpus.bytes.size());
      corpus.bytes.append(text.substr(doc_start, doc_end - doc_start));
      const int64_t piece = max_bytes > 0 ? max_bytes : len;
      for (int64_t at = 0; at < len; at += piece, ++added) add_document(begin + at, std::min(piece, len - at), corpus);
    }
    doc_start = std::string_view::npos;
  };
  size_t pos = 0;
  while (pos < text.size()) {
    size_t eol = text.find('\n', pos);
    if (eol == std::string_view::npos) eol = text.size();
    if (is_blank(text.substr(pos, eol - pos))) {
      flush();
    } else {
      if (doc_start == std::string_view::npos) doc_start = pos;
      doc_end = eol;
    }
    pos = eol + 1;
  }
  flush();
  return added;
}

std::shared_ptr<const TextCorpus> load_corpus(const TextPipelineOptions& options) {
  auto corpus = std::make_shared<TextCorpus>();
  corpus->root = options.corpus();
  for (const auto& path : list_data_files(options.corpus(), kCorpusFix)) {
    std::string text = read_text_file(path);
    internal::TextFile file{path, static_cast<int64_t>(text.size()), 0};
    file.documents = add_documents(text, options.min_document_bytes(), options.max_document_bytes(), *corpus);
    corpus->files.push_back(std::move(file));
  }
  MIH_CHECK_CODE(!corpus->files.empty(), Code::kFailedPrecondition, "corpus '", options.corpus().string(),
                 "' has no regular file; ", kCorpusFix);
  MIH_CHECK_CODE(corpus->num_documents() > 0, Code::kFailedPrecondition, "corpus '", options.corpus().string(),
                 "' holds no document: its ", corpus->files.size(),
                 " file(s) are empty or hold only documents shorter than min_document_bytes (",
                 options.min_document_bytes(), "); ", kCorpusFix);
  return corpus;
}

}  // namespace

std::vector<int64_t> ByteTokenizer::encode(std::string_view text) {
  std::vector<int64_t> tokens(text.size());
  for (size_t i = 0; i < text.size(); ++i) tokens[i] = static_cast<unsigned char>(text[i]);
  return tokens;
}

std::string ByteTokenizer::decode(std::span<const int64_t> tokens) {
  std::string text;
  text.reserve(tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    const int64_t t = tokens[i];
    MIH_CHECK(t >= 0 && t < kVocab, "ByteTokenizer::decode: token ", i, " must be in [0, ", kVocab, "), got ", t);
    if (t < 256) text.push_back(static_cast<char>(static_cast<unsigned char>(t)));
  }
  return text;
}

void to_json(nlohmann::json& j, const TextPipelineOptions& o) {
  j = {{"corpus", o.corpus().string()},
       {"seq_len", o.seq_len()},
       {"global_batch", o.global_batch()},
       {"packing", o.packing()},
       {"shuffle", o.shuffle()},
       {"seed", o.seed()},
       {"min_document_bytes", o.min_document_bytes()},
       {"document_ids", o.document_ids()},
       {"max_document_bytes", o.max_document_bytes()},
       {"epoch_samples", o.epoch_samples()}};
}

void from_json(const nlohmann::json& j, TextPipelineOptions& o) {
  check_known_fields(j, "text pipeline options",
                     {"corpus", "seq_len", "global_batch", "packing", "shuffle", "seed", "min_document_bytes",
                      "document_ids", "max_document_bytes", "epoch_samples"});
  TextPipelineOptions d;
  o.corpus(j.contains("corpus") ? fs::path(j.at("corpus").get<std::string>()) : d.corpus());
  o.seq_len(j.value("seq_len", d.seq_len()));
  o.global_batch(j.value("global_batch", d.global_batch()));
  o.packing(j.value("packing", d.packing()));
  o.shuffle(j.value("shuffle", d.shuffle()));
  o.seed(j.value("seed", d.seed()));
  o.min_document_bytes(j.value("min_document_bytes", d.min_document_bytes()));
  o.document_ids(j.value("document_ids", d.document_ids()));
  o.max_document_bytes(j.value("max_document_bytes", d.max_document_bytes()));
  o.epoch_samples(j.value("epoch_samples", d.epoch_samples()));
}

void PrintTo(const TextPipelineOptions& o, std::ostream* os) { *os << nlohmann::json(o).dump(); }

TextPipeline::TextPipeline(TextPipelineOptions options) : options_(std::move(options)) {
  MIH_CHECK(options_.seq_len() >= 1, "text pipeline: 'seq_len' must be >= 1, got ", options_.seq_len());
  MIH_CHECK(options_.global_batch() >= 1, "text pipeline: 'global_batch' must be >= 1, got ",
            options_.global_batch());
  MIH_CHECK(options_.min_document_bytes() >= 1, "text pipeline: 'min_document_bytes' must be >= 1, got ",
            options_.min_document_bytes());
  MIH_CHECK(options_.max_document_bytes() >= 0, "text pipeline: 'max_document_bytes' must be >= 0 (0: no limit), got ",
            options_.max_document_bytes());
  MIH_CHECK(options_.packing() || !options_.document_ids(), "text pipeline: 'document_ids' numbers the documents of "
            "a packed row, and 'packing' is false (one document per row); set packing or drop document_ids");
  MIH_CHECK(options_.epoch_samples() >= 0, "text pipeline: 'epoch_samples' must be >= 0 (0: no epochs), got ",
            options_.epoch_samples());
  MIH_CHECK(options_.packing() || options_.epoch_samples() == 0, "text pipeline: 'epoch_samples' makes samples of "
            "packed windows, and 'packing' is false; set packing or drop epoch_samples");
  corpus_ = load_corpus(options_);
  MIH_CHECK(options_.epoch_samples() <= num_windows(), "text pipeline: 'epoch_samples' ", options_.epoch_samples(),
            " is more than the ", num_windows(), " windows of seq_len ", options_.seq_len(), " + 1 tokens in one pass of ",
            "the corpus (", num_tokens(), " tokens); ask for at most ", num_windows(), " or a larger corpus");
}

int64_t TextPipeline::num_windows() const { return (corpus_->tokens - 1) / options_.seq_len(); }

SampleId TextPipeline::sample_at(int64_t position) const {
  const int64_t n = options_.epoch_samples();
  MIH_CHECK(n > 0, "text pipeline: sample_at needs 'epoch_samples' (the pipeline has no epochs)");
  MIH_CHECK(position >= 0, "text pipeline: a sample position must be >= 0, got ", position);
  const int64_t epoch = position / n;
  return {epoch, shuffled_order(n, options_.seed(), epoch, options_.shuffle())[static_cast<size_t>(position % n)]};
}

Batch TextPipeline::samples_batch(int64_t first_position) const {
  const int64_t b = options_.global_batch();
  const int64_t n = options_.epoch_samples();
  MIH_CHECK(n > 0, "text pipeline: samples_batch needs 'epoch_samples' (the pipeline has no epochs)");
  MIH_CHECK(first_position >= 0 && first_position <= std::numeric_limits<int64_t>::max() - b,
            "text pipeline: sample position ", first_position, " is not in [0, int64 max - global_batch]");
  // Each epoch's order once (a batch touches one or two epochs), not once per row.
  std::vector<SampleId> samples;
  std::vector<int64_t> offsets, order;
  for (int64_t p = first_position, epoch = -1; p < first_position + b; ++p) {
    if (p / n != epoch) {
      epoch = p / n;
      order = shuffled_order(n, options_.seed(), epoch, options_.shuffle());
    }
    samples.push_back({epoch, order[static_cast<size_t>(p % n)]});
    offsets.push_back(samples.back().index * options_.seq_len());
  }
  Batch batch = rows(offsets);
  batch.samples = std::move(samples);
  return batch;
}

Batch TextPipeline::batch(int64_t step) const {
  const int64_t b = options_.global_batch();
  const int64_t s = options_.seq_len();
  MIH_CHECK(step >= 0, "text pipeline: step must be >= 0, got ", step);
  MIH_CHECK(step < std::numeric_limits<int64_t>::max() / (b * (s + 1)) - 1, "text pipeline: step ", step,
            " overflows the token offset (global_batch ", b, " * seq_len ", s, ")");
  if (options_.epoch_samples() > 0) return samples_batch(step * b);
  // Row r: the window at token (step * B + r) * S of the endless stream (packed), or document
  // step * B + r of the cycled passes (padded).
  std::vector<int64_t> starts;
  for (int64_t r = 0; r < b; ++r) starts.push_back(options_.packing() ? (step * b + r) * s : step * b + r);
  return rows(starts);
}

Batch TextPipeline::rows(const std::vector<int64_t>& starts) const {
  const auto b = static_cast<int64_t>(starts.size());
  const int64_t s = options_.seq_len();
  const TextCorpus& corpus = *corpus_;
  PassCache passes(corpus, options_);

  auto input_ids = at::empty({b, s}, at::kLong);
  auto labels = at::empty({b, s}, at::kLong);
  auto position_ids = at::empty({b, s}, at::kLong);
  auto loss_mask = at::empty({b, s}, at::kLong);
  auto attention_mask = at::empty({b, s}, at::kLong);
  int64_t* in = input_ids.data_ptr<int64_t>();
  int64_t* lab = labels.data_ptr<int64_t>();
  int64_t* pos = position_ids.data_ptr<int64_t>();
  int64_t* loss = loss_mask.data_ptr<int64_t>();
  int64_t* attn = attention_mask.data_ptr<int64_t>();
  at::Tensor document_ids = options_.document_ids() ? at::empty({b, s}, at::kLong) : at::Tensor();
  int64_t* docs = options_.document_ids() ? document_ids.data_ptr<int64_t>() : nullptr;

  // Where each row's window came from, for the check that recomputes the batch from the raw
  // documents (Batch::provenance).
  auto provenance = std::make_shared<BatchProvenance>();
  provenance->packed = options_.packing();
  provenance->rows.resize(static_cast<size_t>(b));
  provenance->document_bytes = [corpus = corpus_](int64_t d) {
    MIH_CHECK(d >= 0 && d < corpus->num_documents(), "text pipeline: document ", d, " is not in [0, ",
              corpus->num_documents(), ")");
    return corpus->bytes.substr(static_cast<size_t>(corpus->doc_begin[d]), static_cast<size_t>(corpus->doc_bytes[d]));
  };
  provenance->bos = ByteTokenizer::kBos;
  provenance->eos = ByteTokenizer::kEos;
  provenance->pad = ByteTokenizer::kPad;
  if (options_.document_ids()) provenance->document_field = kDocumentIdsField;

  std::vector<int64_t> window(static_cast<size_t>(s + 1)), span_of(static_cast<size_t>(s + 1));
  for (int64_t r = 0; r < b; ++r) {
    const int64_t row = r * s;
    if (options_.packing()) {
      int64_t offset = starts[r];  // in the endless stream of passes
      int64_t filled = 0;
      while (filled < s + 1) {
        const Pass& pass = passes.get(offset / corpus.tokens);
        const int64_t in_pass = offset % corpus.tokens;
        const auto k = std::upper_bound(pass.start.begin(), pass.start.end(), in_pass) - pass.start.begin() - 1;
        const int64_t doc = pass.order[k];
        const int64_t j = in_pass - pass.start[k];
        const int64_t n = std::min(corpus.doc_tokens(doc) - j, s + 1 - filled);
        for (int64_t t = 0; t < n; ++t) {
          window[filled + t] = corpus.token(doc, j + t);
          span_of[filled + t] = static_cast<int64_t>(provenance->rows[r].size());
        }
        provenance->rows[r].push_back({doc, j, n});
        filled += n;
        offset += n;
      }
      for (int64_t t = 0; t < s; ++t) {
        const bool target_is_bos = window[t + 1] == ByteTokenizer::kBos;
        in[row + t] = window[t];
        lab[row + t] = target_is_bos ? kIgnoreIndex : window[t + 1];
        loss[row + t] = target_is_bos ? 0 : 1;
        // F27 (docs/fault-catalog.md): packed positions counted through the row, never restarted at a
        // document start (a collator that numbers a packed row 0..S-1); the reference shares
        // the pipeline, so only the recomputation from the documents (PipelineOutputs) sees it.
        const bool restart = t == 0 || (window[t] == ByteTokenizer::kBos && !fault::active(fault::Fault::kF27));
        pos[row + t] = restart ? 0 : pos[row + t - 1] + 1;
        attn[row + t] = 1;
        if (docs != nullptr) docs[row + t] = span_of[t];
      }
    } else {
      const int64_t index = starts[r];  // in the endless sequence of passes' documents
      const int64_t doc = passes.get(index / corpus.num_documents()).order[index % corpus.num_documents()];
      const int64_t n = std::min(corpus.doc_tokens(doc), s + 1);
      for (int64_t t = 0; t < n; ++t) window[t] = corpus.token(doc, t);
      provenance->rows[r].push_back({doc, 0, n});
      std::fill(window.begin() + n, window.end(), ByteTokenizer::kPad);
      for (int64_t t = 0; t < s; ++t) {
        const bool target_is_pad = window[t + 1] == ByteTokenizer::kPad;
        in[row + t] = window[t];
        lab[row + t] = target_is_pad ? kIgnoreIndex : window[t + 1];
        loss[row + t] = target_is_pad ? 0 : 1;
        pos[row + t] = t;
        attn[row + t] = window[t] == ByteTokenizer::kPad ? 0 : 1;
      }
    }
  }
  Batch batch;
  batch.input_ids = std::move(input_ids);
  batch.labels = std::move(labels);
  batch.position_ids = std::move(position_ids);
  batch.fields["loss_mask"] = std::move(loss_mask);
  batch.fields["attention_mask"] = std::move(attention_mask);
  if (document_ids.defined()) batch.fields[kDocumentIdsField] = std::move(document_ids);
  batch.provenance = std::move(provenance);
  return batch;
}

BatchSource TextPipeline::source() const {
  return [pipeline = *this](int64_t step) { return pipeline.batch(step); };
}

int64_t TextPipeline::num_documents() const { return corpus_->num_documents(); }

int64_t TextPipeline::num_tokens() const { return corpus_->tokens; }

nlohmann::json TextPipeline::describe() const {
  auto files = nlohmann::json::array();
  for (const auto& f : corpus_->files) {
    files.push_back({{"path", f.path.string()}, {"bytes", f.bytes}, {"documents", f.documents}});
  }
  return {{"corpus", corpus_->root.string()},
          {"files", std::move(files)},
          {"documents", num_documents()},
          {"tokens", num_tokens()},
          {"vocab", ByteTokenizer::kVocab},
          {"options", options_}};
}

}  // namespace mih::data

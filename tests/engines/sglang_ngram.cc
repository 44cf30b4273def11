// A Python binding of SGLang's n-gram corpus (sglang/kernels/jit/csrc/ngram_corpus, the 0.5.23 wheel) for
// tests/test_engine_drafters.py: SGLang's own C++ trie, matched and filled as its NGRAM worker does, without the
// tvm-ffi and torch layers around it.  Our code; SGLang's sources are compiled beside it by
// scripts/engine_drafters.sh and are not part of this repository.
#include <nanobind/nanobind.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <memory>

#include "ngram.h"

namespace nb = nanobind;
using sglang::ngram::Ngram;
using sglang::ngram::Param;

class Corpus {
 public:
  Corpus(size_t capacity, size_t max_trie_depth, size_t min_bfs_breadth, size_t max_bfs_breadth,
         size_t draft_token_num, const std::string& match_type) {
    Param param;
    param.enable = true;
    param.enable_router_mode = false;
    param.max_trie_depth = max_trie_depth;
    param.min_bfs_breadth = min_bfs_breadth;
    param.max_bfs_breadth = max_bfs_breadth;
    param.draft_token_num = draft_token_num;
    param.match_type = match_type;
    ngram_ = std::make_unique<Ngram>(capacity, param);
  }

  // NgramCorpus.insert, then synchronize (the worker synchronizes before it matches).
  void insert(std::vector<std::vector<int32_t>> batch) {
    ngram_->asyncInsert(std::move(batch));
    ngram_->synchronize();
  }

  // One request's batch_get: (tokens, mask), the root first, draft_token_num slots, the mask row-major.
  std::pair<std::vector<int32_t>, std::vector<uint8_t>> match(int64_t state_id, const std::vector<int32_t>& tail,
                                                              size_t total_len) {
    auto result = ngram_->batchMatch({state_id}, {tail}, {total_len});
    return {result.token, result.mask};
  }

 private:
  std::unique_ptr<Ngram> ngram_;
};

NB_MODULE(sglang_ngram, m) {
  nb::class_<Corpus>(m, "Corpus")
      .def(nb::init<size_t, size_t, size_t, size_t, size_t, const std::string&>())
      .def("insert", &Corpus::insert)
      .def("match", &Corpus::match);
}

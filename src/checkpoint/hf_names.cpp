#include "hyperpar/checkpoint/hf_names.h"

#include <ATen/ATen.h>

#include <map>

#include "hyperpar/core/error.h"

namespace hyperpar::checkpoint {

std::string HFTensorRef::expert(int64_t e) const {
  std::string s = name;
  const auto at = s.find("{e}");
  if (at != std::string::npos) s.replace(at, 3, std::to_string(e));
  return s;
}

HFTensorRef hf_tensor_of(const std::string& fqn, const models::TransformerConfig& cfg) {
  using K = HFTensorRef::Kind;
  if (fqn == "tok_embeddings.weight") return {K::kPlain, "model.embed_tokens.weight"};
  if (fqn == "norm.weight") return {K::kPlain, "model.norm.weight"};
  if (fqn == "output.weight") return {K::kPlain, "lm_head.weight"};
  const std::string prefix = "layers.";
  auto unknown = [&] {
    return UsageError("no Hugging Face name for hyperpar parameter '" + fqn + "'");
  };
  if (fqn.rfind(prefix, 0) != 0) throw unknown();
  const auto dot = fqn.find('.', prefix.size());
  if (dot == std::string::npos) throw unknown();
  const std::string layer = fqn.substr(prefix.size(), dot - prefix.size());
  const std::string rest = fqn.substr(dot + 1);
  const std::string hf = "model.layers." + layer + ".";
  const int64_t hd = cfg.dim / cfg.n_heads;
  static const std::map<std::string, std::string> plain = {
      {"attention_norm.weight", "input_layernorm.weight"},
      {"attention.wv.weight", "self_attn.v_proj.weight"},
      {"attention.wo.weight", "self_attn.o_proj.weight"},
      {"ffn_norm.weight", "post_attention_layernorm.weight"},
      {"feed_forward.w1.weight", "mlp.gate_proj.weight"},
      {"feed_forward.w3.weight", "mlp.up_proj.weight"},
      {"feed_forward.w2.weight", "mlp.down_proj.weight"},
      {"moe.router.weight", "block_sparse_moe.gate.weight"}};
  if (auto it = plain.find(rest); it != plain.end()) return {K::kPlain, hf + it->second};
  if (rest == "attention.wq.weight") return {K::kRotaryRows, hf + "self_attn.q_proj.weight", hd};
  if (rest == "attention.wk.weight") return {K::kRotaryRows, hf + "self_attn.k_proj.weight", hd};
  for (const char* w : {"w1", "w2", "w3"})
    if (rest == std::string("moe.experts.") + w)
      return {K::kExperts, hf + "block_sparse_moe.experts.{e}." + w + ".weight"};
  throw unknown();
}

at::Tensor rotary_rows_to_hf(const at::Tensor& w, int64_t hd) {
  HP_CHECK(w.dim() == 2 && hd % 2 == 0 && w.size(0) % hd == 0, "rotary rows: ", w.sizes(),
           " is not [heads * ", hd, ", D]");
  const int64_t heads = w.size(0) / hd;
  return w.reshape({heads, hd / 2, 2, w.size(1)}).transpose(1, 2).reshape(w.sizes());
}

at::Tensor rotary_rows_from_hf(const at::Tensor& w, int64_t hd) {
  HP_CHECK(w.dim() == 2 && hd % 2 == 0 && w.size(0) % hd == 0, "rotary rows: ", w.sizes(),
           " is not [heads * ", hd, ", D]");
  const int64_t heads = w.size(0) / hd;
  return w.reshape({heads, 2, hd / 2, w.size(1)}).transpose(1, 2).reshape(w.sizes());
}

}  // namespace hyperpar::checkpoint

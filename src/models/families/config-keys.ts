import type { ConfigKeys } from '../config-fields.ts';

/**
 * Every key of each family's config.json, by what TensorLink does with it (config-fields.ts's ConfigKeys; the keys every
 * family shares are there): read by the family's reader, kept by transformers 5.17 without computing from it, or a
 * setting not built here, accepted at its default only. configFromHF refuses any other key, naming it. Each list is
 * transformers' config class for the family (and the keys its older configs on the Hub hold) against the reader.
 */

/** The rotary's keys: rope_theta and its scaling (rope.ts's ropeFromHF; original_max_position_embeddings for llama3 and yarn). */
const ROPE = ['rope_theta', 'rope_scaling', 'rope_parameters', 'original_max_position_embeddings'];

/** What decoder-config.ts's decoderConfigFromHF reads (partial_rotary_factor refused but where the family rotates part of a head). */
const DECODER = [
  'vocab_size', 'max_position_embeddings', 'hidden_size', 'intermediate_size', 'num_hidden_layers', 'num_attention_heads',
  'num_key_value_heads', 'head_dim', 'hidden_act', 'rms_norm_eps', 'initializer_range', 'tie_word_embeddings', 'partial_rotary_factor',
  ...ROPE,
];

/** The per-block windows decoder-config.ts's layerTypesFromHF reads. */
const WINDOWS = ['use_sliding_window', 'sliding_window', 'max_window_layers', 'layer_types'];

/** What moe-decoder.ts's moeDecoderFromHF reads. */
const MOE = [
  'vocab_size', 'max_position_embeddings', 'hidden_size', 'num_hidden_layers', 'num_attention_heads', 'num_key_value_heads', 'head_dim',
  'hidden_act', 'rms_norm_eps', 'initializer_range', 'tie_word_embeddings', 'num_experts_per_tok', 'output_router_logits', ...ROPE,
];

/** What gemma.ts's gemmaFromHF reads for both Gemmas. */
const GEMMA = [
  'vocab_size', 'max_position_embeddings', 'hidden_size', 'intermediate_size', 'num_hidden_layers', 'num_attention_heads',
  'num_key_value_heads', 'head_dim', 'hidden_activation', 'rms_norm_eps', 'initializer_range', 'tie_word_embeddings', 'attention_bias',
  'query_pre_attn_scalar', 'sliding_window', 'layer_types', 'final_logit_softcapping', 'use_bidirectional_attention', ...ROPE,
];

/** No bias where transformers' class has none: a config that names one holds weights the family has no place for. */
const NO_BIASES = { attention_bias: [false], mlp_bias: [false] };

/** The keys of each family, by model_type (each family of the registry has its entry: test/models/config-fields.test.ts). */
export const CONFIG_KEYS: Readonly<Record<string, ConfigKeys>> = {
  gpt2: {
    read: ['vocab_size', 'n_positions', 'n_embd', 'n_layer', 'n_head', 'n_inner', 'activation_function', 'layer_norm_epsilon',
      'initializer_range', 'tie_word_embeddings'],
    // n_ctx: an older name transformers no longer reads (n_positions is); n_special, predict_special_tokens: OpenAI GPT's,
    // in GPT-2 medium's and large's config.json; summary_*: GPT2DoubleHeadsModel's head only
    unused: ['n_ctx', 'n_special', 'predict_special_tokens', 'summary_type', 'summary_use_proj', 'summary_activation', 'summary_proj_to_labels'],
    fixed: { scale_attn_weights: [true], scale_attn_by_inverse_layer_idx: [false], reorder_and_upcast_attn: [false] },
  },
  // pretraining_tp: transformers 5 computes nothing from it (4.x sliced its projections into as many sums)
  llama: { read: [...DECODER, 'attention_bias', 'mlp_bias'], unused: ['pretraining_tp'] },
  mistral: { read: [...DECODER, 'sliding_window'], fixed: NO_BIASES },
  // transformers' Qwen2 has biases on q, k and v whatever attention_bias says
  qwen2: { read: [...DECODER, ...WINDOWS], unused: ['attention_bias'], fixed: { mlp_bias: [false] } },
  qwen3: { read: [...DECODER, ...WINDOWS, 'attention_bias'], fixed: { mlp_bias: [false] } },
  phi3: { read: [...DECODER, 'sliding_window'], fixed: NO_BIASES },
  // hidden_act: transformers' Gemmas take hidden_activation
  gemma2: { read: [...GEMMA, 'attn_logit_softcapping'], unused: ['hidden_act'] },
  gemma3_text: {
    read: [...GEMMA, 'rope_local_base_freq', 'sliding_window_pattern'],
    // attn_logit_softcapping: Gemma 3's attention takes no soft-cap; _sliding_window_pattern: derived, layer_types rules
    unused: ['hidden_act', 'attn_logit_softcapping', '_sliding_window_pattern'],
    ropePerLayerType: true,
  },
  // router_aux_loss_coef weighs the load-balancing loss, which only output_router_logits (refused) adds
  mixtral: { read: [...MOE, 'intermediate_size', 'num_local_experts', 'router_jitter_noise', 'sliding_window'], unused: ['router_aux_loss_coef'] },
  qwen3_moe: {
    read: [...MOE, 'intermediate_size', 'moe_intermediate_size', 'num_experts', 'num_local_experts', 'norm_topk_prob', 'attention_bias',
      'mlp_only_layers', 'decoder_sparse_step', 'use_sliding_window', 'sliding_window'],
    // max_window_layers: not part of transformers' Qwen3MoeConfig, which keeps it unread
    unused: ['router_aux_loss_coef', 'max_window_layers'],
  },
  gpt_neox: {
    read: ['vocab_size', 'max_position_embeddings', 'hidden_size', 'num_hidden_layers', 'num_attention_heads', 'intermediate_size',
      'rotary_pct', 'rotary_emb_base', 'partial_rotary_factor', 'use_parallel_residual', 'attention_bias', 'hidden_act', 'layer_norm_eps',
      'initializer_range', 'tie_word_embeddings', ...ROPE],
    nestedPartialRotary: true,
  },
  falcon: {
    read: ['vocab_size', 'max_position_embeddings', 'hidden_size', 'n_embed', 'num_hidden_layers', 'n_layer', 'num_attention_heads',
      'num_kv_heads', 'ffn_hidden_size', 'new_decoder_architecture', 'multi_query', 'parallel_attn', 'num_ln_in_parallel_attn', 'alibi',
      'bias', 'activation', 'layer_norm_epsilon', 'initializer_range', 'tie_word_embeddings', ...ROPE],
    // in Falcon-7B's config.json; transformers' Falcon does not read it
    unused: ['apply_residual_connection_post_layernorm'],
  },
  bloom: {
    read: ['vocab_size', 'max_position_embeddings', 'hidden_size', 'n_embed', 'n_layer', 'num_hidden_layers', 'n_head',
      'num_attention_heads', 'layer_norm_epsilon', 'initializer_range', 'tie_word_embeddings', 'apply_residual_connection_post_layernorm',
      'slow_but_exact', 'pretraining_tp'],
    // Megatron's settings in BLOOM's config.json, which transformers' BLOOM does not read (its MLP is 4 × hidden whatever n_inner says)
    unused: ['n_inner', 'masked_softmax_fusion', 'bias_dropout_fusion', 'attention_softmax_in_fp32', 'skip_bias_add', 'skip_bias_add_qkv',
      'offset_alibi', 'seq_length'],
  },
};

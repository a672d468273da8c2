// Package tokenize turns a request into the exact token ids the model server
// will see: it renders the model's chat template (as vLLM's
// /v1/chat/completions does) and encodes the prompt with the model's Hugging
// Face tokenizer.json, in pure Go and in process.
//
// Supported tokenizers are byte-level BPE models of the Llama-3/3.1 and
// Qwen2/Qwen3 kind: normalizer none or NFC/NFD/NFKC/NFKD (or a Sequence of
// them), pre_tokenizer ByteLevel or a Sequence of Split (regex, Isolated or
// Removed) and ByteLevel, added and special tokens, merges in the "a b" and
// ["a", "b"] forms, ignore_merges, and a TemplateProcessing post-processor
// for add_special_tokens. Anything else is refused when the file is loaded,
// naming the field, rather than encoded approximately: an exact count or
// none.
//
// This is not sim/tokenize, which is the simulator's approximate tokenizer.
//
// A model without a configured tokenizer has no exact tokens: Registry.Lookup
// returns an error wrapping ErrNotConfigured, and the caller falls back to
// its estimate.
package tokenize

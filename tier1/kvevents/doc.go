// Package kvevents follows the KV-cache events model servers publish
// (vLLM, SGLang and TensorRT-LLM, over ZeroMQ) and keeps an exact per-pod
// index of the blocks each pod holds in its prefix cache, for Tier 1's
// scorer (docs/kv-events.md).
//
// The pieces: Decoder reads a message payload in either wire form (msgpack
// maps tagged "type", vLLM's since vllm#42892, or the older positional
// arrays); Index re-hashes each stored block's token ids with our own
// chain (HashTokens, which a request's prompt tokens go through too) and
// answers Match, per pod, with the cached prefix in blocks, and State with
// whether the pod's entries can be trusted; Subscriber connects to every
// pod's publisher (or binds one socket pods publish to), detects sequence
// gaps and restarts, replays what it missed, and keeps hostile input
// within the limits of Config.
package kvevents

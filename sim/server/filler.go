package server

// fillerWords are what simulated models "generate": one word per token, so
// token counts and text agree.
var fillerWords = [...]string{
	"the", "model", "simulated", "answer", "is", "a", "deterministic", "stream",
	"of", "words", "that", "stand", "in", "for", "real", "tokens",
	"while", "the", "router", "learns", "which", "pod", "is", "fastest",
	"prefix", "cache", "hits", "make", "first", "tokens", "arrive", "sooner",
	"and", "queues", "grow", "when", "load", "rises", "beyond", "capacity",
	"each", "GPU", "has", "its", "own", "speed", "memory", "and",
	"batch", "so", "routing", "matters", "more", "than", "it", "seems",
	"here", "ends", "one", "more", "sentence", "about", "nothing", "much",
}

// fillerSeed derives a per-prompt starting word, so equal prompts get equal
// outputs and different prompts usually differ.
func fillerSeed(tokens []uint32) uint64 {
	h := uint64(14695981039346656037)
	for _, t := range tokens {
		h ^= uint64(t)
		h *= 1099511628211
	}
	return h
}

// fillerToken returns the text of generated token i: the first without a
// leading space, later ones with one, as BPE tokens of running text.
func fillerToken(seed uint64, i int) string {
	w := fillerWords[(seed+uint64(i))%uint64(len(fillerWords))]
	if i == 0 {
		return w
	}
	return " " + w
}

// appendFiller appends generated tokens [from, to) to b.
func appendFiller(b []byte, seed uint64, from, to int) []byte {
	for i := from; i < to; i++ {
		b = append(b, fillerToken(seed, i)...)
	}
	return b
}

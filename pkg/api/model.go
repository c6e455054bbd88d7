package api

import "strings"

// ModelMatches reports whether a GPU model selector (as written in
// use-gputype / nouse-gputype, or an openb gpu_spec entry) selects the GPU
// model name that NVML reports.
//
// Matching ignores ASCII case (model names are ASCII; other characters must
// match exactly, so that matching a whole name and matching a word inside a
// longer name agree), and the selector must equal the model or
// appear in it as a whole word: "A100" selects "NVIDIA A100-SXM4-40GB", but
// "A10" does not (it selects "NVIDIA A10"). Word boundaries are any
// character other than a letter or a digit. An empty selector selects nothing.
func ModelMatches(selector, model string) bool {
	selector = strings.TrimSpace(selector)
	if selector == "" {
		return false
	}
	n := len(selector)
	for i := 0; i+n <= len(model); i++ {
		if !equalFoldASCII(model[i:i+n], selector) {
			continue
		}
		if (i == 0 || !isAlnum(model[i-1])) && (i+n == len(model) || !isAlnum(model[i+n])) {
			return true
		}
	}
	return false
}

func isAlnum(b byte) bool {
	return b >= '0' && b <= '9' || b >= 'a' && b <= 'z' || b >= 'A' && b <= 'Z'
}

// equalFoldASCII is strings.EqualFold restricted to ASCII letters. Unicode
// folding can pair strings of different byte lengths (K and the Kelvin
// sign), which a fixed-width scan over the model would miss.
func equalFoldASCII(a, b string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := 0; i < len(a); i++ {
		if lowerASCII(a[i]) != lowerASCII(b[i]) {
			return false
		}
	}
	return true
}

func lowerASCII(c byte) byte {
	if c >= 'A' && c <= 'Z' {
		return c + 'a' - 'A'
	}
	return c
}

// Command imageref judges image references with github.com/distribution/reference, the
// grammar kubelet parses images with (ParseNormalizedNamed), for the contract test
// tests/contract/test_image_reference_grammar.py.
//
// Input (stdin): a JSON object {"pattern": "<RE2 pattern>", "references": ["...", ...]}.
// Output (stdout): a JSON array, one object per reference, in order:
//
//	{"ok": bool, "error": "...", "name": "...", "tag": "...", "digest": "...",
//	 "grammar": bool, "pattern": bool}
//
// ok/error/name/tag/digest: reference.ParseNormalizedNamed (name fully qualified,
// docker.io/library/ added as kubelet does). grammar: reference.ReferenceRegexp matches the
// whole string (the grammar alone, no length or digest checks). pattern: the given pattern
// (the CRD's) matches, with Go's regexp as the API server evaluates a CRD pattern.
package main

import (
	// the digest algorithms go-digest offers only when their hash is linked in, as it is
	// in kubelet; without them every digest is "unsupported digest algorithm"
	_ "crypto/sha256"
	_ "crypto/sha512"
	"encoding/json"
	"fmt"
	"os"
	"regexp"

	"github.com/distribution/reference"
)

type input struct {
	Pattern    string   `json:"pattern"`
	References []string `json:"references"`
}

type verdict struct {
	OK      bool   `json:"ok"`
	Error   string `json:"error,omitempty"`
	Name    string `json:"name,omitempty"`
	Tag     string `json:"tag,omitempty"`
	Digest  string `json:"digest,omitempty"`
	Grammar bool   `json:"grammar"`
	Pattern bool   `json:"pattern"`
}

func judge(ref string, pattern *regexp.Regexp) verdict {
	v := verdict{Pattern: pattern.MatchString(ref)}
	if m := reference.ReferenceRegexp.FindStringSubmatchIndex(ref); m != nil && m[0] == 0 && m[1] == len(ref) {
		v.Grammar = true
	}
	named, err := reference.ParseNormalizedNamed(ref)
	if err != nil {
		v.Error = err.Error()
		return v
	}
	v.OK = true
	v.Name = named.Name()
	if t, ok := named.(reference.Tagged); ok {
		v.Tag = t.Tag()
	}
	if d, ok := named.(reference.Digested); ok {
		v.Digest = d.Digest().String()
	}
	return v
}

func main() {
	var in input
	if err := json.NewDecoder(os.Stdin).Decode(&in); err != nil {
		fmt.Fprintln(os.Stderr, "imageref: reading the input:", err)
		os.Exit(2)
	}
	pattern, err := regexp.Compile(in.Pattern)
	if err != nil {
		fmt.Fprintln(os.Stderr, "imageref: the pattern does not compile:", err)
		os.Exit(2)
	}
	out := make([]verdict, len(in.References))
	for i, ref := range in.References {
		out[i] = judge(ref, pattern)
	}
	if err := json.NewEncoder(os.Stdout).Encode(out); err != nil {
		fmt.Fprintln(os.Stderr, "imageref: writing the output:", err)
		os.Exit(2)
	}
}

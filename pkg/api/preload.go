package api

import (
	"fmt"
	"path"
	"strings"
)

// MaxPreloads bounds the libraries AnnotationPreload may name.
const MaxPreloads = 8

// preloadDirs are where a declared preload may live: the system library
// directories and /opt, which an unprivileged user of an image cannot
// write (the preload list also reaches setuid programs, as the image's
// own list did).
var preloadDirs = []string{"/lib", "/lib64", "/usr/lib", "/usr/lib64", "/usr/local/lib", "/opt"}

// ParsePreloads reads the value of AnnotationPreload: at most MaxPreloads
// absolute, clean paths of shared libraries (a name ending in .so or
// .so.<version>) under /lib, /lib64, /usr/lib, /usr/lib64, /usr/local/lib
// or /opt, of letters, digits and . _ + - only. The error names the entry
// and what is wrong with it.
func ParsePreloads(value string) ([]string, error) {
	var out []string
	for _, e := range strings.FieldsFunc(value, func(r rune) bool { return r == ',' || r == '\n' }) {
		e = strings.TrimSpace(e)
		if e == "" {
			continue
		}
		if len(out) == MaxPreloads {
			return nil, fmt.Errorf("more than %d libraries", MaxPreloads)
		}
		if err := checkPreload(e); err != nil {
			return nil, fmt.Errorf("%q: %s", e, err)
		}
		out = append(out, e)
	}
	return out, nil
}

func checkPreload(p string) error {
	if len(p) > 256 {
		return fmt.Errorf("longer than 256 bytes")
	}
	for _, r := range p {
		ok := r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("/._+-", r)
		if !ok {
			return fmt.Errorf("may hold only letters, digits and / . _ + -")
		}
	}
	if !path.IsAbs(p) || path.Clean(p) != p {
		return fmt.Errorf("must be an absolute, clean path (no .., no //, no trailing /)")
	}
	if strings.HasPrefix(p, ContainerLimiterDir+"/") {
		return fmt.Errorf("is in %s, the GPU limiter's directory, which the node agent preloads itself", ContainerLimiterDir)
	}
	inDir := false
	for _, d := range preloadDirs {
		if strings.HasPrefix(p, d+"/") {
			inDir = true
		}
	}
	if !inDir {
		return fmt.Errorf("must be under %s (directories an unprivileged user of the image cannot write)", strings.Join(preloadDirs, ", "))
	}
	base := path.Base(p)
	stem, ver, _ := strings.Cut(base, ".so")
	if stem == "" || !strings.Contains(base, ".so") {
		return fmt.Errorf("must name a shared library (lib….so or lib….so.<version>)")
	}
	for _, part := range strings.Split(strings.TrimPrefix(ver, "."), ".") {
		if ver == "" {
			break
		}
		if part == "" || strings.Trim(part, "0123456789") != "" {
			return fmt.Errorf("must name a shared library (lib….so or lib….so.<version>)")
		}
	}
	return nil
}

// PreloadList is the content of a container's preload list: the GPU
// limiter first, then the pod's declared libraries, one per line.
func PreloadList(limiter string, declared []string) []byte {
	return []byte(strings.Join(append([]string{limiter}, declared...), "\n") + "\n")
}

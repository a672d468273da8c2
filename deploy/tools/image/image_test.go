//go:build linux

package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"debug/elf"
	"errors"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// TestImage builds the real image for this machine's architecture only (one
// compile of infergate, the test's whole cost; `make image` adds arm64),
// reads the archive back as an OCI layout, and runs `infergate version` out
// of the unpacked filesystem as the image's user, 65532.
func TestImage(t *testing.T) {
	if testing.Short() {
		t.Skip("builds infergate for linux; skipped with -short")
	}
	arch := runtime.GOARCH
	platform, ok := supportedPlatforms["linux/"+arch]
	if !ok {
		t.Skipf("the image has no linux/%s variant to run here", arch)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	work := t.TempDir()
	archive := filepath.Join(work, "infergate-image.tar")
	var log bytes.Buffer
	res, err := build(ctx, options{
		root:      repoRoot,
		out:       archive,
		platforms: []v1.Platform{platform},
		gzipLevel: gzip.BestSpeed,
		log:       &log,
	})
	if err != nil {
		t.Fatalf("build: %v\n%s", err, log.String())
	}
	version, err := readVersion(repoRoot)
	if err != nil {
		t.Fatal(err)
	}
	if res.ref != defaultRepository+":"+version {
		t.Errorf("image named %q, want %s:%s", res.ref, defaultRepository, version)
	}
	if head, _ := gitHead(ctx, repoRoot); head != "" && res.revision != head {
		t.Errorf("revision %q, want HEAD %q", res.revision, head)
	}

	// The archive is an OCI layout: untar it and open it with the layout
	// reader, as podman and skopeo would.
	layoutDir := filepath.Join(work, "layout")
	untar(t, archive, layoutDir)
	lp, err := layout.FromPath(layoutDir)
	if err != nil {
		t.Fatal(err)
	}
	top, err := lp.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	topManifest, err := top.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(topManifest.Manifests) != 1 {
		t.Fatalf("index.json lists %d entries, want 1", len(topManifest.Manifests))
	}
	entry := topManifest.Manifests[0]
	if entry.MediaType != types.OCIImageIndex || entry.Digest != res.digest {
		t.Errorf("index.json entry is %s %s, want the image index %s", entry.MediaType, entry.Digest, res.digest)
	}
	for _, key := range []string{"org.opencontainers.image.ref.name", "io.containerd.image.name"} {
		if got := entry.Annotations[key]; got != res.ref {
			t.Errorf("index.json annotation %s = %q, want %q", key, got, res.ref)
		}
	}
	idx, err := top.ImageIndex(entry.Digest)
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(im.Manifests) != 1 || im.Manifests[0].Platform == nil || !im.Manifests[0].Platform.Equals(platform) {
		t.Fatalf("image index manifests %+v, want one for %+v", im.Manifests, platform)
	}
	img, err := idx.Image(im.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}

	t.Run("config", func(t *testing.T) {
		cf, err := img.ConfigFile()
		if err != nil {
			t.Fatal(err)
		}
		if cf.Config.User != "65532:65532" {
			t.Errorf("User = %q, want 65532:65532", cf.Config.User)
		}
		if strings.Join(cf.Config.Entrypoint, " ") != "/infergate" || len(cf.Config.Cmd) != 0 {
			t.Errorf("Entrypoint %q Cmd %q, want [/infergate] and no Cmd", cf.Config.Entrypoint, cf.Config.Cmd)
		}
		if cf.OS != "linux" || cf.Architecture != arch {
			t.Errorf("config platform %s/%s, want linux/%s", cf.OS, cf.Architecture, arch)
		}
		for k, want := range map[string]string{
			"org.opencontainers.image.version":  version,
			"org.opencontainers.image.revision": res.revision,
			"org.opencontainers.image.source":   sourceURL,
		} {
			if got := cf.Config.Labels[k]; got != want {
				t.Errorf("label %s = %q, want %q", k, got, want)
			}
		}
		if !contains(cf.Config.Env, "SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt") {
			t.Errorf("Env %q lacks SSL_CERT_FILE", cf.Config.Env)
		}
	})

	root := filepath.Join(work, "rootfs")
	unpack(t, img, root)

	t.Run("filesystem", func(t *testing.T) {
		// Exactly these paths, modes and owners: no shell, no package
		// manager, nothing writable by the user but its home and /tmp.
		want := map[string]struct {
			mode fs.FileMode
			uid  int
		}{
			"etc":                               {fs.ModeDir | 0o755, 0},
			"etc/group":                         {0o644, 0},
			"etc/passwd":                        {0o644, 0},
			"etc/ssl":                           {fs.ModeDir | 0o755, 0},
			"etc/ssl/certs":                     {fs.ModeDir | 0o755, 0},
			"etc/ssl/certs/ca-certificates.crt": {0o644, 0},
			"home":                              {fs.ModeDir | 0o755, 0},
			"home/nonroot":                      {fs.ModeDir | 0o700, nonroot},
			"infergate":                         {0o755, 0},
			"tmp":                               {fs.ModeDir | fs.ModeSticky | 0o777, 0},
		}
		got := map[string]bool{}
		err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
			if err != nil || path == root {
				return err
			}
			rel, _ := filepath.Rel(root, path)
			got[rel] = true
			w, ok := want[rel]
			if !ok {
				t.Errorf("unexpected path /%s in the image", rel)
				return nil
			}
			fi, err := os.Lstat(path)
			if err != nil {
				return err
			}
			if fi.Mode() != w.mode {
				t.Errorf("/%s mode %v, want %v", rel, fi.Mode(), w.mode)
			}
			// Owners survive the unpacking only when the test can chown.
			if uid := int(fi.Sys().(*syscall.Stat_t).Uid); os.Geteuid() == 0 && uid != w.uid {
				t.Errorf("/%s owned by %d, want %d", rel, uid, w.uid)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		for p := range want {
			if !got[p] {
				t.Errorf("/%s missing from the image", p)
			}
		}
		if _, err := os.Lstat(filepath.Join(root, "bin", "sh")); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("/bin/sh: %v, want it absent", err)
		}
		passwd, err := os.ReadFile(filepath.Join(root, "etc", "passwd"))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(passwd), "\nnonroot:x:65532:65532:") {
			t.Errorf("/etc/passwd has no nonroot 65532 entry:\n%s", passwd)
		}
		// Static: no ELF interpreter, so it runs on an empty base.
		f, err := elf.Open(filepath.Join(root, "infergate"))
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		for _, p := range f.Progs {
			if p.Type == elf.PT_INTERP {
				t.Error("/infergate is dynamically linked (has PT_INTERP)")
			}
		}
	})

	t.Run("runs as nonroot", func(t *testing.T) {
		if os.Geteuid() != 0 {
			if os.Getenv("CI") != "" {
				t.Fatal("running the binary as uid 65532 needs root; CI runs tests as root")
			}
			t.Skip("running the binary as uid 65532 needs root (run the tests as root to cover it)")
		}
		// The unpacked tree must be reachable by 65532, as it is in a
		// container; t.TempDir makes its directories 0700.
		for _, dir := range []string{filepath.Dir(work), work, root} {
			if err := os.Chmod(dir, 0o755); err != nil {
				t.Fatal(err)
			}
		}
		cmd := exec.CommandContext(ctx, filepath.Join(root, "infergate"), "version")
		cmd.Dir = root
		cmd.Env = []string{"SSL_CERT_FILE=" + filepath.Join(root, certPath)}
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nonroot, Gid: nonroot}}
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("infergate version as 65532: %v\n%s", err, out)
		}
		for _, want := range []string{
			"infergate " + version + "\n",
			"\nrevision:  " + res.revision + "\n",
			"\nplatform:  linux/" + arch + "\n",
		} {
			if !strings.Contains(string(out), want) {
				t.Errorf("output lacks %q:\n%s", want, out)
			}
		}
	})
}

// TestBuildFailsEarly checks the errors build gives before it compiles
// anything: each names the input at fault.
func TestBuildFailsEarly(t *testing.T) {
	dir := t.TempDir()
	badVersion := filepath.Join(dir, "bad-version")
	if err := os.MkdirAll(badVersion, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(badVersion, "VERSION"), []byte("1.0 beta\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	linux := []v1.Platform{supportedPlatforms["linux/amd64"]}
	tests := []struct {
		name string
		o    options
		want []string
	}{
		{name: "no CA bundle", o: options{root: repoRoot, caCerts: filepath.Join(dir, "missing.crt"), platforms: linux}, want: []string{"CA certificates", "missing.crt", "ca-certificates"}},
		{name: "CA file without PEM", o: options{root: repoRoot, caCerts: filepath.Join(repoRoot, "VERSION"), platforms: linux}, want: []string{"VERSION", "no PEM certificate"}},
		{name: "no VERSION file", o: options{root: dir, platforms: linux}, want: []string{"VERSION"}},
		{name: "VERSION not a tag", o: options{root: badVersion, platforms: linux}, want: []string{"VERSION", `"1.0 beta"`, "not a valid image tag"}},
		{name: "-version not a tag", o: options{root: repoRoot, version: "v1/2", platforms: linux}, want: []string{"-version", `"v1/2"`}},
		{name: "-revision unsafe", o: options{root: repoRoot, revision: "abc -X main.x=y", platforms: linux}, want: []string{"-revision"}},
		{name: "no platforms", o: options{root: repoRoot}, want: []string{"no platforms"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.o.out = filepath.Join(dir, "out.tar")
			_, err := build(context.Background(), tt.o)
			if err == nil {
				t.Fatal("build succeeded")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
			if _, err := os.Stat(tt.o.out); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("a failed build left %s behind (%v)", tt.o.out, err)
			}
		})
	}
}

func TestParsePlatforms(t *testing.T) {
	tests := []struct {
		in      string
		want    []string
		wantErr string
	}{
		{in: "linux/amd64,linux/arm64", want: []string{"linux/amd64", "linux/arm64/v8"}},
		{in: " linux/arm64 , linux/arm64", want: []string{"linux/arm64/v8"}},
		{in: "linux/s390x", wantErr: `"linux/s390x"`},
		{in: "", wantErr: `""`},
	}
	for _, tt := range tests {
		got, err := parsePlatforms(tt.in)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("parsePlatforms(%q) error %v, want one naming %s", tt.in, err, tt.wantErr)
			}
			continue
		}
		if err != nil {
			t.Errorf("parsePlatforms(%q): %v", tt.in, err)
			continue
		}
		var names []string
		for _, p := range got {
			names = append(names, p.String())
		}
		if strings.Join(names, ",") != strings.Join(tt.want, ",") {
			t.Errorf("parsePlatforms(%q) = %v, want %v", tt.in, names, tt.want)
		}
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// untar unpacks the archive build wrote (plain files and directories only).
func untar(t *testing.T, archive, dir string) {
	t.Helper()
	f, err := os.Open(archive)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	extract(t, tar.NewReader(f), dir, false)
}

// unpack writes img's flattened filesystem into dir with the image's modes
// and owners, as a container runtime would.
func unpack(t *testing.T, img v1.Image, dir string) {
	t.Helper()
	rc := mutate.Extract(img)
	defer rc.Close()
	extract(t, tar.NewReader(rc), dir, true)
}

func extract(t *testing.T, tr *tar.Reader, dir string, owners bool) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		name := filepath.Clean(h.Name)
		if !filepath.IsLocal(name) {
			t.Fatalf("archive entry %q escapes the directory", h.Name)
		}
		path := filepath.Join(dir, name)
		mode := fs.FileMode(h.Mode).Perm()
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(path, 0o755); err != nil {
				t.Fatal(err)
			}
		case tar.TypeReg:
			if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
				t.Fatal(err)
			}
			f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := io.Copy(f, tr); err != nil {
				f.Close()
				t.Fatal(err)
			}
			if err := f.Close(); err != nil {
				t.Fatal(err)
			}
		default:
			t.Fatalf("archive entry %q has type %q; the image holds only files and directories", h.Name, h.Typeflag)
		}
		// Chmod after creation: the umask would clear bits otherwise, and
		// sticky only survives chmod.
		if h.Mode&0o1000 != 0 {
			mode |= fs.ModeSticky
		}
		if err := os.Chmod(path, mode); err != nil {
			t.Fatal(err)
		}
		if owners {
			if err := os.Lchown(path, h.Uid, h.Gid); err != nil && os.Geteuid() == 0 {
				t.Fatal(err)
			}
		}
	}
}

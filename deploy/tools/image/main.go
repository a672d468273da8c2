// Command image builds infergate's container image without a Docker engine
// and writes it as an OCI image layout in a tar file (what `make image` runs).
//
// The image is the one the Dockerfile at the repository root builds, file for
// file: a static infergate binary (CGO_ENABLED=0, -trimpath) at /infergate,
// the build machine's CA bundle at /etc/ssl/certs/ca-certificates.crt,
// /etc/passwd and /etc/group (rootfs/ here) with the user nonroot (65532), an
// empty /home/nonroot and a /tmp. There is no shell. It runs as 65532:65532
// with ENTRYPOINT ["/infergate"], and carries the OCI labels version,
// revision and source. One image per platform (linux/amd64 and linux/arm64 by
// default) goes into an OCI image index, named
// <repository>:<version> with the version from the VERSION file: the tag the
// Helm charts and the Terraform examples default to.
//
// The archive loads with `docker load -i`, `podman load -i` or
// `skopeo copy oci-archive:...`; unpacked, `crane push --index DIR REF`
// pushes it.
//
// Usage:
//
//	image [-out bin/infergate-image.tar] [-platforms linux/amd64,linux/arm64]
//	      [-version V] [-revision R] [-repository R] [-ca-certs FILE] [-root DIR]
package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	_ "embed"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

const (
	// defaultRepository is where release images are pushed; the charts'
	// image.repository and the Terraform examples' image default name it too
	// (versions_test.go checks).
	defaultRepository = "ghcr.io/infergate/infergate"
	defaultCACerts    = "/etc/ssl/certs/ca-certificates.crt"
	sourceURL         = "https://github.com/infergate/infergate"

	// nonroot is the user and group the container runs as (distroless's
	// nonroot), the same number the charts' securityContext uses.
	nonroot  = 65532
	certPath = "etc/ssl/certs/ca-certificates.crt"
)

var (
	//go:embed rootfs/etc/passwd
	passwd []byte
	//go:embed rootfs/etc/group
	group []byte
)

// supportedPlatforms are the platforms the image is built for; the variant
// is what registries and `docker buildx` record for them.
var supportedPlatforms = map[string]v1.Platform{
	"linux/amd64": {OS: "linux", Architecture: "amd64"},
	"linux/arm64": {OS: "linux", Architecture: "arm64", Variant: "v8"},
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return
		}
		fmt.Fprintln(os.Stderr, "image:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	flags := flag.NewFlagSet("image", flag.ContinueOnError)
	flags.SetOutput(stderr)
	var o options
	flags.StringVar(&o.root, "root", ".", "repository root (holds go.mod and VERSION)")
	flags.StringVar(&o.out, "out", "bin/infergate-image.tar", "OCI archive to write")
	platforms := flags.String("platforms", "linux/amd64,linux/arm64", "comma-separated platforms to build")
	flags.StringVar(&o.version, "version", "", "image version and tag (default: the VERSION file)")
	flags.StringVar(&o.revision, "revision", "", "VCS revision for the labels (default: git rev-parse HEAD)")
	flags.StringVar(&o.repository, "repository", defaultRepository, "image repository the archive names")
	flags.StringVar(&o.caCerts, "ca-certs", defaultCACerts, "CA bundle (PEM) to put in the image")
	if err := flags.Parse(args); err != nil {
		return err
	}
	if flags.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q", flags.Arg(0))
	}
	var err error
	if o.platforms, err = parsePlatforms(*platforms); err != nil {
		return err
	}
	o.log = stderr
	res, err := build(ctx, o)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "wrote %s: %s (index %s)\n", o.out, res.ref, res.digest)
	for _, m := range res.manifests {
		fmt.Fprintf(stdout, "  %s %s\n", m.platform, m.digest)
	}
	fmt.Fprintf(stdout, "load it with: docker load -i %s   (or podman load -i %s)\n", o.out, o.out)
	return nil
}

// options are build's inputs; empty fields take the documented defaults.
type options struct {
	root       string
	out        string
	platforms  []v1.Platform
	version    string
	revision   string
	repository string
	caCerts    string
	// gzipLevel compresses the layer (0: gzip.DefaultCompression).
	gzipLevel int
	log       io.Writer
}

type result struct {
	ref       string // repository:version, as the archive names it
	version   string
	revision  string
	created   time.Time
	digest    v1.Hash // of the image index
	manifests []platformManifest
}

type platformManifest struct {
	platform string
	digest   v1.Hash
}

func parsePlatforms(s string) ([]v1.Platform, error) {
	var out []v1.Platform
	seen := map[string]bool{}
	for _, name := range strings.Split(s, ",") {
		name = strings.TrimSpace(name)
		p, ok := supportedPlatforms[name]
		if !ok {
			return nil, fmt.Errorf("-platforms: unsupported platform %q (supported: linux/amd64, linux/arm64)", name)
		}
		if !seen[name] {
			seen[name] = true
			out = append(out, p)
		}
	}
	return out, nil
}

// tagPattern is the OCI distribution spec's tag grammar.
var tagPattern = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$`)

// revPattern keeps the revision safe to pass through -ldflags.
var revPattern = regexp.MustCompile(`^[A-Za-z0-9._+-]{1,128}$`)

// readVersion reads the VERSION file: the one place the release version lives.
func readVersion(root string) (string, error) {
	path := filepath.Join(root, "VERSION")
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("reading the version: %w", err)
	}
	v := strings.TrimSpace(string(b))
	if !tagPattern.MatchString(v) {
		return "", fmt.Errorf("%s: %q is not a valid image tag", path, v)
	}
	return v, nil
}

func build(ctx context.Context, o options) (*result, error) {
	if o.root == "" {
		o.root = "."
	}
	if o.repository == "" {
		o.repository = defaultRepository
	}
	if o.caCerts == "" {
		o.caCerts = defaultCACerts
	}
	if len(o.platforms) == 0 {
		return nil, errors.New("no platforms to build")
	}
	if o.gzipLevel == 0 {
		o.gzipLevel = gzip.DefaultCompression
	}
	if o.log == nil {
		o.log = io.Discard
	}
	res := &result{version: o.version, revision: o.revision}
	if res.version == "" {
		v, err := readVersion(o.root)
		if err != nil {
			return nil, err
		}
		res.version = v
	} else if !tagPattern.MatchString(res.version) {
		return nil, fmt.Errorf("-version: %q is not a valid image tag", res.version)
	}
	res.ref = o.repository + ":" + res.version

	// Everything cheap is checked before the compiles.
	certs, err := os.ReadFile(o.caCerts)
	if err != nil {
		return nil, fmt.Errorf("CA certificates for the image: %w (install the ca-certificates package, or point -ca-certs at a PEM bundle)", err)
	}
	if !bytes.Contains(certs, []byte("-----BEGIN CERTIFICATE-----")) {
		return nil, fmt.Errorf("CA certificates for the image: %s holds no PEM certificate", o.caCerts)
	}
	gitRev, gitTime := gitHead(ctx, o.root)
	if res.revision == "" {
		res.revision = gitRev
	}
	if res.revision == "" {
		res.revision = "unknown"
		fmt.Fprintln(o.log, "image: no git revision (not a git checkout?); labelling the image revision \"unknown\"")
	}
	if !revPattern.MatchString(res.revision) {
		return nil, fmt.Errorf("-revision: %q is not a revision (letters, digits and ._+- only)", res.revision)
	}
	res.created = createdTime(gitTime)

	work, err := os.MkdirTemp("", "infergate-image-")
	if err != nil {
		return nil, err
	}
	defer func() { _ = os.RemoveAll(work) }() // a leftover temporary directory costs disk, not the image

	labels := map[string]string{
		"org.opencontainers.image.title":       "infergate",
		"org.opencontainers.image.description": "Two-tier, GPU-aware router for LLM inference",
		"org.opencontainers.image.version":     res.version,
		"org.opencontainers.image.revision":    res.revision,
		"org.opencontainers.image.source":      sourceURL,
		"org.opencontainers.image.licenses":    "Apache-2.0",
	}
	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	var adds []mutate.IndexAddendum
	for _, p := range o.platforms {
		name := p.OS + "/" + p.Architecture
		bin := filepath.Join(work, "infergate-"+p.OS+"-"+p.Architecture)
		fmt.Fprintf(o.log, "image: building %s for %s\n", res.ref, name)
		if err := goBuild(ctx, o.root, p, res.version, res.revision, bin); err != nil {
			return nil, err
		}
		img, err := platformImage(p, bin, certs, res.created, labels, o.gzipLevel)
		if err != nil {
			return nil, fmt.Errorf("%s image: %w", name, err)
		}
		d, err := img.Digest()
		if err != nil {
			return nil, fmt.Errorf("%s image: %w", name, err)
		}
		res.manifests = append(res.manifests, platformManifest{platform: name, digest: d})
		plat := p
		adds = append(adds, mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{Platform: &plat}})
	}
	idx = mutate.AppendManifests(idx, adds...)
	idx = mutate.Annotations(idx, map[string]string{
		"org.opencontainers.image.version":  res.version,
		"org.opencontainers.image.revision": res.revision,
		"org.opencontainers.image.source":   sourceURL,
		"org.opencontainers.image.created":  res.created.Format(time.RFC3339),
	}).(v1.ImageIndex)
	if res.digest, err = idx.Digest(); err != nil {
		return nil, err
	}
	if err := writeArchive(filepath.Join(work, "layout"), o.out, idx, res.ref, res.created); err != nil {
		return nil, err
	}
	return res, nil
}

// gitHead returns HEAD's commit and commit time, or empty values where git
// or the checkout is missing (a source tarball still builds).
func gitHead(ctx context.Context, root string) (rev string, when time.Time) {
	out, err := exec.CommandContext(ctx, "git", "-C", root, "log", "-1", "--format=%H %ct").Output()
	if err != nil {
		return "", time.Time{}
	}
	fields := strings.Fields(string(out))
	if len(fields) != 2 {
		return "", time.Time{}
	}
	sec, err := strconv.ParseInt(fields[1], 10, 64)
	if err != nil {
		return fields[0], time.Time{}
	}
	return fields[0], time.Unix(sec, 0).UTC()
}

// createdTime is the image's creation time: SOURCE_DATE_EPOCH when set, else
// the commit time, else the Unix epoch. Never the wall clock, so that the
// same commit builds the same image.
func createdTime(commit time.Time) time.Time {
	if s := os.Getenv("SOURCE_DATE_EPOCH"); s != "" {
		if sec, err := strconv.ParseInt(s, 10, 64); err == nil {
			return time.Unix(sec, 0).UTC()
		}
	}
	if !commit.IsZero() {
		return commit
	}
	return time.Unix(0, 0).UTC()
}

// goBuild cross-compiles a static infergate for p. -buildvcs=auto overrides
// a GOFLAGS=-buildvcs=false so the binary records its commit when it can.
func goBuild(ctx context.Context, root string, p v1.Platform, version, revision, out string) error {
	ldflags := fmt.Sprintf("-s -w -X main.version=%s -X main.revision=%s", version, revision)
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-buildvcs=auto", "-ldflags="+ldflags, "-o", out, "./cmd/infergate")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS="+p.OS, "GOARCH="+p.Architecture)
	var stderr bytes.Buffer
	cmd.Stdout = &stderr
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("go build for %s/%s: %w\n%s", p.OS, p.Architecture, err, stderr.String())
	}
	return nil
}

// layerEntry is one file or directory of the image's single layer.
type layerEntry struct {
	name     string
	mode     int64 // permission bits (and sticky)
	uid, gid int
	data     []byte // nil for a directory
}

// layerEntries is the image's filesystem, in tar order; the Dockerfile's
// final stage produces the same tree.
func layerEntries(binary, certs []byte) []layerEntry {
	return []layerEntry{
		{name: "etc/", mode: 0o755},
		{name: "etc/group", mode: 0o644, data: group},
		{name: "etc/passwd", mode: 0o644, data: passwd},
		{name: "etc/ssl/", mode: 0o755},
		{name: "etc/ssl/certs/", mode: 0o755},
		{name: certPath, mode: 0o644, data: certs},
		{name: "home/", mode: 0o755},
		{name: "home/nonroot/", mode: 0o700, uid: nonroot, gid: nonroot},
		{name: "infergate", mode: 0o755, data: binary},
		{name: "tmp/", mode: 0o1777},
	}
}

func layerTar(entries []layerEntry, modTime time.Time) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Mode: e.mode, Uid: e.uid, Gid: e.gid, ModTime: modTime, Format: tar.FormatPAX}
		if e.data == nil {
			h.Typeflag = tar.TypeDir
		} else {
			h.Typeflag = tar.TypeReg
			h.Size = int64(len(e.data))
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if _, err := tw.Write(e.data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func platformImage(p v1.Platform, binPath string, certs []byte, created time.Time, labels map[string]string, gzipLevel int) (v1.Image, error) {
	binary, err := os.ReadFile(binPath)
	if err != nil {
		return nil, err
	}
	tb, err := layerTar(layerEntries(binary, certs), created)
	if err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(tb)), nil
	}, tarball.WithMediaType(types.OCILayer), tarball.WithCompressionLevel(gzipLevel), tarball.WithCompressedCaching)
	if err != nil {
		return nil, err
	}
	img := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	img, err = mutate.Append(img, mutate.Addendum{
		Layer:     layer,
		MediaType: types.OCILayer,
		History: v1.History{
			Created:   v1.Time{Time: created},
			CreatedBy: "deploy/tools/image: /infergate, CA certificates, /etc/passwd, /etc/group",
		},
	})
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture, cf.Variant = p.OS, p.Architecture, p.Variant
	cf.Created = v1.Time{Time: created}
	cf.Config = v1.Config{
		User:       fmt.Sprintf("%d:%d", nonroot, nonroot),
		Entrypoint: []string{"/infergate"},
		Env:        []string{"SSL_CERT_FILE=/" + certPath},
		WorkingDir: "/",
		Labels:     labels,
	}
	return mutate.ConfigFile(img, cf)
}

// writeArchive writes idx as an OCI image layout in dir, then tars the
// layout into out (through a temporary file, so a failed build never leaves
// a truncated archive behind). The index.json entry names the image twice:
// org.opencontainers.image.ref.name (podman, skopeo) and
// io.containerd.image.name (docker load).
func writeArchive(dir, out string, idx v1.ImageIndex, ref string, modTime time.Time) error {
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return fmt.Errorf("writing the OCI layout: %w", err)
	}
	if err := p.AppendIndex(idx, layout.WithAnnotations(map[string]string{
		"org.opencontainers.image.ref.name": ref,
		"io.containerd.image.name":          ref,
	})); err != nil {
		return fmt.Errorf("writing the OCI layout: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(out), "."+filepath.Base(out)+".*")
	if err != nil {
		return err
	}
	defer func() { _ = os.Remove(tmp.Name()) }() // gone after the rename; otherwise a failed write's leftover
	if err := tarDir(tmp, dir, modTime); err != nil {
		_ = tmp.Close() // the failed write's error is the one to return
		return fmt.Errorf("writing %s: %w", out, err)
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Chmod(tmp.Name(), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), out)
}

// tarDir writes dir's tree to w in lexical order with fixed owners and
// times, so the archive depends only on its contents.
func tarDir(w io.Writer, dir string, modTime time.Time) error {
	tw := tar.NewWriter(w)
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || path == dir {
			return err
		}
		rel, err := filepath.Rel(dir, path)
		if err != nil {
			return err
		}
		h := &tar.Header{Name: filepath.ToSlash(rel), ModTime: modTime, Mode: 0o644, Typeflag: tar.TypeReg}
		if d.IsDir() {
			h.Name += "/"
			h.Mode = 0o755
			h.Typeflag = tar.TypeDir
			return tw.WriteHeader(h)
		}
		f, err := os.Open(path)
		if err != nil {
			return err
		}
		defer func() { _ = f.Close() }() // read only: closing loses nothing
		fi, err := f.Stat()
		if err != nil {
			return err
		}
		h.Size = fi.Size()
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		_, err = io.Copy(tw, f)
		return err
	})
	if err != nil {
		return err
	}
	return tw.Close()
}

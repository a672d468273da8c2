package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
)

// Set at link time by the image builds (the Dockerfile and deploy/tools/image):
//
//	-ldflags "-X main.version=0.1.0 -X main.revision=<commit>"
//
// They are package variables because -X can set nothing else. A stamped
// version wins over the module version Go records, which for a build inside
// the repository is a pseudo-version (or "(devel)" without VCS data), not the
// release the image is tagged with. A stamped revision is used only when Go
// recorded none (a Docker build context has no .git).
var (
	version  string
	revision string
)

// buildInfo is what `infergate version` prints.
type buildInfo struct {
	version   string // release version: stamped, else the module version
	module    string // the main module's version as Go recorded it
	revision  string // VCS commit
	modified  string // "true" when built from a tree with uncommitted changes
	committed string // VCS commit time (RFC 3339)
	goVersion string
	platform  string // GOOS/GOARCH
}

const unknown = "unknown"

// readBuildInfo combines what the Go toolchain recorded (bi, ok from
// debug.ReadBuildInfo) with the link-time stamps.
func readBuildInfo(bi *debug.BuildInfo, ok bool, stampedVersion, stampedRevision string) buildInfo {
	info := buildInfo{
		version:   stampedVersion,
		module:    unknown,
		revision:  unknown,
		modified:  unknown,
		committed: unknown,
		goVersion: runtime.Version(),
		platform:  runtime.GOOS + "/" + runtime.GOARCH,
	}
	if ok && bi != nil {
		if bi.Main.Version != "" {
			info.module = bi.Main.Version
		}
		if bi.GoVersion != "" {
			info.goVersion = bi.GoVersion
		}
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				info.revision = s.Value
			case "vcs.modified":
				info.modified = s.Value
			case "vcs.time":
				info.committed = s.Value
			}
		}
	}
	if info.version == "" {
		info.version = info.module
		if info.version == unknown {
			info.version = "(devel)"
		}
	}
	if info.revision == unknown && stampedRevision != "" {
		info.revision = stampedRevision
	}
	return info
}

func (b buildInfo) write(w io.Writer) {
	fmt.Fprintf(w, "infergate %s\n", b.version)
	fmt.Fprintf(w, "module:    %s\n", b.module)
	fmt.Fprintf(w, "revision:  %s\n", b.revision)
	fmt.Fprintf(w, "modified:  %s\n", b.modified)
	fmt.Fprintf(w, "committed: %s\n", b.committed)
	fmt.Fprintf(w, "go:        %s\n", b.goVersion)
	fmt.Fprintf(w, "platform:  %s\n", b.platform)
}

func runVersion(_ context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("version", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintln(stderr, "Usage: infergate version")
		fmt.Fprintln(stderr, "Prints the version, VCS revision, Go version and platform infergate was built with.")
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q (version takes none)", fs.Arg(0))
	}
	bi, ok := debug.ReadBuildInfo()
	readBuildInfo(bi, ok, version, revision).write(stdout)
	return nil
}

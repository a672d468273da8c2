package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"reflect"
	"slices"
	"strings"

	"github.com/infergate/infergate/shared/config"
	"github.com/infergate/infergate/shared/tlsfiles"
	tier1 "github.com/infergate/infergate/tier1/server"
	tier2 "github.com/infergate/infergate/tier2/server"
)

// tiers are the configurations check knows, by the name --tier takes.
var tiers = map[string]func() any{
	"tier1": func() any { return &tier1.Config{} },
	"tier2": func() any { return &tier2.Config{} },
}

// runCheck is `infergate check`: everything the servers check of a
// configuration file at start, plus that the files it names can be read
// (TLS certificates and keys are loaded), without opening a socket or
// reaching Redis, Consul or a pod.
func runCheck(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fset := flag.NewFlagSet("check", flag.ContinueOnError)
	fset.SetOutput(stderr)
	cfgPath := fset.String("config", "", "configuration file to check (YAML)")
	tierName := fset.String("tier", "", "tier1 or tier2; default: told from the file's top-level keys")
	fset.Usage = func() {
		fmt.Fprintln(stderr, "Usage: infergate check --config FILE [--tier tier1|tier2]")
		fmt.Fprintln(stderr)
		fmt.Fprintln(stderr, "Check a Tier 1 or Tier 2 configuration file without starting anything: every")
		fmt.Fprintln(stderr, "problem is listed with file:line:column, the key and what it accepts, and the")
		fmt.Fprintln(stderr, "TLS and token files it names are read. Exit status 0 when the file is valid.")
		fmt.Fprintln(stderr)
		fset.PrintDefaults()
	}
	if err := parseFlags(fset, args); err != nil {
		return err
	}
	if *cfgPath == "" {
		fset.Usage()
		return errors.New("--config is required")
	}
	data, err := os.ReadFile(*cfgPath)
	if err != nil {
		return fmt.Errorf("read config: %w", err)
	}
	f, err := config.Parse(*cfgPath, data)
	if err != nil {
		return report(stderr, *cfgPath, "", err)
	}
	tier := *tierName
	switch {
	case tier == "":
		if tier, err = detectTier(f); err != nil {
			return err
		}
	case tiers[tier] == nil:
		return fmt.Errorf("--tier %q: want tier1 or tier2", tier)
	}
	v := tiers[tier]()
	if err := f.Decode(v); err != nil {
		return report(stderr, *cfgPath, tier, err)
	}
	if err := f.Locate(v, checkFiles(ctx, v)); err != nil {
		return report(stderr, *cfgPath, tier, err)
	}
	fmt.Fprintf(stdout, "%s: ok (%s)\n", *cfgPath, tier)
	return nil
}

// parseFlags parses a subcommand's flags; they take no arguments, and a
// word left over (a file named without --config, a flag after it, which
// the flag package then ignores) is an error rather than ignored.
func parseFlags(fset *flag.FlagSet, args []string) error {
	if err := fset.Parse(args); err != nil {
		return err
	}
	if fset.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q: infergate %s takes only flags (see --help); anything after it was not read",
			fset.Arg(0), fset.Name())
	}
	return nil
}

// report prints every problem, one per line, and returns the summary.
func report(w io.Writer, path, tier string, err error) error {
	var errs config.Errors
	if !errors.As(err, &errs) {
		return err
	}
	fmt.Fprintln(w, errs.Error())
	what := "problem"
	if len(errs) > 1 {
		what = "problems"
	}
	if tier == "" {
		return fmt.Errorf("%s: %d %s", path, len(errs), what)
	}
	return fmt.Errorf("%s: %d %s (%s)", path, len(errs), what, tier)
}

// loadConfig is how tier1 and tier2 read their file: the same problems
// check reports, with the same messages, one per line.
func loadConfig(path string, v any) error {
	err := config.Load(path, v)
	var errs config.Errors
	if errors.As(err, &errs) {
		return fmt.Errorf("invalid configuration (%d problems; infergate check --config %s lists them too):\n%w", len(errs), path, errs)
	}
	return err
}

// detectTier tells the tier a file configures from its top-level keys:
// the tier that has more of them as keys of its own.
func detectTier(f *config.File) (string, error) {
	top := f.TopKeys()
	own := map[string][]string{}
	keys := map[string]map[string]bool{}
	for name, mk := range tiers {
		keys[name] = map[string]bool{}
		for _, k := range config.Keys(mk()) {
			if !strings.ContainsAny(k.Path, ".[") {
				keys[name][k.Path] = true
			}
		}
	}
	for _, k := range top {
		if keys["tier1"][k] && !keys["tier2"][k] {
			own["tier1"] = append(own["tier1"], k)
		}
		if keys["tier2"][k] && !keys["tier1"][k] {
			own["tier2"] = append(own["tier2"], k)
		}
	}
	switch n1, n2 := len(own["tier1"]), len(own["tier2"]); {
	case n1 > n2:
		return "tier1", nil
	case n2 > n1:
		return "tier2", nil
	}
	return "", fmt.Errorf("%s: cannot tell whether it configures tier1 or tier2 (top-level keys: %s); pass --tier tier1 or --tier tier2",
		f.Name, strings.Join(top, ", "))
}

var (
	serverTLS = reflect.TypeFor[tlsfiles.Server]()
	clientTLS = reflect.TypeFor[tlsfiles.Client]()
)

// checkFiles reads every file the configuration names and loads its TLS
// blocks as the servers would (certificate and key match, chains parse,
// not expired). Errors are at the keys.
func checkFiles(ctx context.Context, v any) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // stops nothing: reloading is off, but NewServer takes a context
	var errs []error
	unreadable := map[string]bool{}
	config.Walk(v, func(path string, val reflect.Value, sf reflect.StructField) {
		key := path[strings.LastIndexAny(path, ".]")+1:]
		isFile := key == "file" || strings.HasSuffix(key, "_file") || slices.Contains(strings.Split(sf.Tag.Get("config"), ","), "file")
		switch {
		case isFile && val.Kind() == reflect.String && val.String() != "":
			if err := readable(val.String()); err != nil {
				errs = append(errs, config.Errorf(path, "%v", err))
				unreadable[path[:max(0, strings.LastIndexByte(path, '.'))]] = true
			}
		case isFile && val.Kind() == reflect.Slice:
			for i := range val.Len() {
				if err := readable(val.Index(i).String()); err != nil {
					errs = append(errs, config.Errorf(config.Index(path, i), "%v", err))
				}
			}
		}
	})
	// TLS blocks whose files are all readable: load them.
	config.Walk(v, func(path string, val reflect.Value, _ reflect.StructField) {
		if unreadable[path] {
			return
		}
		var err error
		switch val.Type() {
		case serverTLS:
			if s := val.Interface().(tlsfiles.Server); s.Enabled() {
				_, err = tlsfiles.NewServer(ctx, s, tlsfiles.Options{Interval: -1})
			}
		case clientTLS:
			if c := val.Interface().(tlsfiles.Client); c.CAFile != "" || c.CertFile != "" {
				_, err = tlsfiles.NewClient(ctx, c, tlsfiles.Options{Interval: -1})
			}
		default:
			return
		}
		if err != nil {
			// tlsfiles names the block by Options.Name, which is unset:
			// the path says it.
			errs = append(errs, config.Errorf(path, "%s", strings.TrimPrefix(err.Error(), "tls : ")))
		}
	})
	return errors.Join(errs...)
}

// readable opens and reads name, as the server would at start.
func readable(name string) error {
	b, err := os.ReadFile(name)
	var pe *fs.PathError
	switch {
	case errors.As(err, &pe):
		return fmt.Errorf("cannot read %s: %v", name, pe.Err)
	case err != nil:
		return fmt.Errorf("cannot read %s: %v", name, err)
	case len(b) == 0:
		return fmt.Errorf("%s is empty", name)
	}
	return nil
}

package main

import (
	"github.com/tierlimit/tierlimit/bpf"

	"fmt"
	"runtime"
	"runtime/debug"

	"github.com/spf13/cobra"
)

// Set with -ldflags "-X main.version=v1.2.3 -X main.commit=abc123"; a
// commit recorded by the Go toolchain (vcs.revision) takes precedence.
var (
	version = "dev"
	commit  = "unknown"
)

// bpfObjectHash returns the hash of the embedded BPF object; a variable so
// that tests can pin it.
var bpfObjectHash = bpf.ObjectHash

func init() { subcommands = append(subcommands, newVersionCmd) }

func newVersionCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version, commit, Go version and BPF object hash",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			v, c := buildVersion()
			_, err := fmt.Fprintf(g.stdout, "version     %s\ncommit      %s\ngo          %s\nbpf object  %s\n",
				v, c, runtime.Version(), bpfObjectHash())
			return err
		},
	}
}

// buildVersion returns the version and commit: the -ldflags values,
// improved by what the Go toolchain recorded in the binary (the module
// version when built with go install, vcs.revision and vcs.modified when
// built in a work tree).
func buildVersion() (v, c string) {
	v, c = version, commit
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return v, c
	}
	if v == "dev" && info.Main.Version != "" && info.Main.Version != "(devel)" {
		v = info.Main.Version
	}
	var rev, modified string
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			modified = s.Value
		}
	}
	if rev != "" {
		c = rev
		if modified == "true" {
			c += "-dirty"
		}
	}
	return v, c
}

// runVersion is the version recorded beside the pinned layout.
func runVersion() string {
	v, c := buildVersion()
	if len(c) > 12 {
		c = c[:12]
	}
	return v + "-" + c
}

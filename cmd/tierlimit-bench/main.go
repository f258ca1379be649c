// Command tierlimit-bench is tierlimit's performance suite (issue 6): the
// program-cost, live-frames and scaling benchmarks of the bpf package, and a
// system-level flood that compares, on the same offered syslog flood through
// a veth, no limiter, tierlimit's XDP program, an nftables rule set and the
// seed's in-app limiter. It writes results.md and a plot of offered against
// passed load per window.
//
//	tierlimit-bench suite   -out deploy/bench -bpf-test bpf.test [-quick]
//	tierlimit-bench flood   [-runs N] [-packets N]        the flood only, to stdout
//	tierlimit-bench receive [-limit] ...                  the collector process (internal)
//	tierlimit-bench windows -metrics URL                   per-window results of a running agent
//	tierlimit-bench trafgen-config -src-mac ... -dst-mac ...
//	tierlimit-bench window-check [-init|-total] -max M ...  make vagrant-e2e's per-window check
//
// It needs root, Linux >= 5.18 (live frames), trafgen (netsniff-ng), nft,
// nsenter and taskset, and two CPUs. Everything it creates lives in network
// namespaces it makes and removes, also on SIGINT/SIGTERM.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

// usageError marks errors in the command line (exit code 2).
type usageError struct{ error }

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "tierlimit-bench:", err)
		var u usageError
		if errors.As(err, &u) {
			os.Exit(2)
		}
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return usageError{errors.New("usage: tierlimit-bench suite|flood|receive|windows|trafgen-config|window-check [flags]")}
	}
	switch args[0] {
	case "suite":
		return runSuite(ctx, args[1:], stdout, stderr)
	case "flood":
		return runFloodCmd(ctx, args[1:], stdout, stderr)
	case "receive":
		return runReceive(ctx, args[1:], stdin, stdout)
	case "windows":
		return runWindows(ctx, args[1:], stdout)
	case "trafgen-config":
		return runTrafgenConfig(args[1:], stdout)
	case "window-check":
		return runWindowCheck(ctx, args[1:], stdout)
	}
	return usageError{fmt.Errorf("unknown command %q", args[0])}
}

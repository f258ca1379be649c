// Command tierlimit is an XDP tiered load-shedder for syslog collectors: it
// counts the selected packets of each window and drops them at random at the
// rate of the tier their count falls in (docs/design.md).
//
// Exit codes: 0 ok, 1 runtime failure, 2 usage or config error.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/tierlimit/tierlimit/internal/earlysignal"
	"github.com/tierlimit/tierlimit/tiers"
)

// Exit codes of the command (docs/design.md §4).
const (
	exitOK      = 0
	exitFailure = 1
	exitUsage   = 2
)

// sighup receives the process's SIGHUPs, which run reloads on. The
// earlysignal package subscribes to them while the program initialises, so
// that a SIGHUP while the agent starts never finds Go's default action
// (exit): one that arrives before the agent is ready is kept and reloads
// once it is. The other commands ignore SIGHUP. It stays nil when tests
// call run directly.
var sighup <-chan os.Signal

func main() {
	sighup = earlysignal.HUP
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(report(os.Stderr, err))
}

// run executes the command line args (without the program name), writing
// results to stdout and logs and errors to stderr, until done or ctx ends.
// main prints the returned error; exitCode maps it to an exit code.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	root := newRootCmd(stdout, stderr)
	// cobra reports bad flags, arguments and subcommands before any RunE
	// starts: whatever fails before then is a usage error.
	started := false
	markStarted(root, &started)
	root.SetArgs(args)
	err := root.ExecuteContext(ctx)
	if err != nil && !started && !isUsage(err) {
		err = usageError{err}
	}
	return err
}

// markStarted wraps the RunE of c and its subcommands to set *started.
func markStarted(c *cobra.Command, started *bool) {
	if f := c.RunE; f != nil {
		c.RunE = func(cmd *cobra.Command, args []string) error {
			*started = true
			return f(cmd, args)
		}
	}
	if f := c.Run; f != nil {
		c.Run = func(cmd *cobra.Command, args []string) {
			*started = true
			f(cmd, args)
		}
	}
	for _, sub := range c.Commands() {
		markStarted(sub, started)
	}
}

// report prints err, if any, as one line on stderr and returns the exit code.
func report(stderr io.Writer, err error) int {
	if err == nil {
		return exitOK
	}
	err = explain(err)
	msg := strings.ReplaceAll(err.Error(), "\n", " ")
	fmt.Fprintf(stderr, "tierlimit: %s\n", msg)
	if isUsage(err) && !isConfig(err) {
		fmt.Fprintln(stderr, "Run 'tierlimit --help' for usage.")
	}
	return exitCode(err)
}

// exitCode maps an error of run to the exit code: 0 for nil, 2 for a
// usageError, a configError or a *tiers.ConfigError, and 1 for the rest.
func exitCode(err error) int {
	switch {
	case err == nil:
		return exitOK
	case isUsage(err), isConfig(err), errors.As(err, new(hostError)):
		return exitUsage
	}
	return exitFailure
}

// hostError marks a host that cannot run the limiter as it is (a kernel
// without a feature the program needs): exit code 2, so that systemd does
// not restart it (RestartPreventExitStatus=2), and no usage line, since no
// flag fixes it.
type hostError struct{ err error }

func (e hostError) Error() string { return e.err.Error() }
func (e hostError) Unwrap() error { return e.err }

// usageError marks a bad command line: exit code 2.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

// usageErrorf returns a usageError with a formatted message.
func usageErrorf(format string, args ...any) error {
	return usageError{fmt.Errorf(format, args...)}
}

// configError marks a policy that cannot be loaded or is invalid: exit code
// 2. A *tiers.ConfigError needs no wrapping; wrap the rest, such as a config
// file that cannot be read.
type configError struct{ err error }

func (e configError) Error() string { return e.err.Error() }
func (e configError) Unwrap() error { return e.err }

func isUsage(err error) bool {
	var u usageError
	return errors.As(err, &u)
}

func isConfig(err error) bool {
	var c configError
	var t *tiers.ConfigError
	return errors.As(err, &c) || errors.As(err, &t)
}

// globals holds what every subcommand shares: the output streams and the
// logger that the --log-format flag sets up.
type globals struct {
	stdout, stderr io.Writer
	logFormat      string
	log            *slog.Logger
}

// logger returns the logger for --log-format, writing to stderr.
func (g *globals) logger() *slog.Logger {
	if g.log == nil {
		opts := &slog.HandlerOptions{Level: slog.LevelInfo}
		if g.logFormat == "json" {
			g.log = slog.New(slog.NewJSONHandler(g.stderr, opts))
		} else {
			g.log = slog.New(slog.NewTextHandler(g.stderr, opts))
		}
	}
	return g.log
}

// subcommands holds the constructors of the subcommands. Each lives in its
// own file, which appends its constructor in an init function:
//
//	func init() { subcommands = append(subcommands, newRunCmd) }
//
// A subcommand gets the streams and the logger from g (g.logger()), the
// context from cmd.Context(), and returns errors: a usageError for a bad
// command line, a configError (or a *tiers.ConfigError) for a bad policy.
// It must not set PersistentPreRunE, which would shadow the root's.
var subcommands []func(g *globals) *cobra.Command

// newRootCmd builds the tierlimit command and its subcommands, writing
// results to stdout and logs to stderr.
func newRootCmd(stdout, stderr io.Writer) *cobra.Command {
	g := &globals{stdout: stdout, stderr: stderr}
	root := &cobra.Command{
		Use:   "tierlimit",
		Short: "XDP tiered load-shedder for syslog collectors",
		Long: `tierlimit counts the selected packets (syslog by default) of each window and,
once the count passes a tier's threshold, drops them at random at that tier's
rate, in XDP, before they reach the collector.

Exit codes: 0 ok, 1 runtime failure, 2 usage or config error.`,
		SilenceErrors: true,
		SilenceUsage:  true,
		PersistentPreRunE: func(cmd *cobra.Command, args []string) error {
			switch g.logFormat {
			case "text", "json":
			default:
				return usageErrorf("--log-format %q: want text or json", g.logFormat)
			}
			g.log = nil // built on first use, with the flag's format
			return nil
		},
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.SetFlagErrorFunc(func(cmd *cobra.Command, err error) error {
		return usageError{err}
	})
	root.PersistentFlags().StringVar(&g.logFormat, "log-format", "text", "log format on stderr: text or json")
	for _, newCmd := range subcommands {
		root.AddCommand(newCmd(g))
	}
	return root
}

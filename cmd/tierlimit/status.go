package main

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/tierlimit/tierlimit/agent"
	"github.com/tierlimit/tierlimit/agent/pin"
	"github.com/tierlimit/tierlimit/bpf"
	"github.com/tierlimit/tierlimit/tiers"
)

func init() { subcommands = append(subcommands, newStatusCmd, newDetachCmd) }

func newStatusCmd(g *globals) *cobra.Command {
	var pinPath string
	var asJSON bool
	var top int
	var shed bool
	var stateFile string
	var fleetOn bool
	var licenseOn bool
	var config string
	cmd := &cobra.Command{
		Use:   "status [--json] [--top N] [--shed] [--fleet --config F] [--license [--config F]]",
		Short: "Show the pinned limiter: interfaces, policy, window and totals",
		Long: `status reads the pinned links and maps, with no agent running, and prints the
interfaces and their XDP mode, the policy in force (tiers with thresholds and
drop rates), the current window's count and tier, and the totals per tier and
verdict: the same numbers /metrics shows. --top N adds the per-source budget
and the N source groups with the most packets over budget.

--shed prints the open shedding episode, or the last one, instead: when it
began (and ended), the packets shed by tier, reason and severity class, and
the source groups with the most sampled sheds, from the state file the agent
keeps (--state-file), so it works with no agent running.

--fleet lists the members of the fleet that the policy in --config names,
as its store holds them: each member's last reported estimate and how long
ago the store heard from it. It asks the store, not an agent.

--license prints today's license spend, its projection at the recent
rate by the day's end, and the pacing (the window's target and budget),
from the license state file the agent keeps beside the episode state
(license.json), with no agent running. With --config F of a policy with
fleet: and license:, it reads the fleet's day from the fleet's store
instead: the day the store's clock is in, the fleet's total and each
member's part.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if n := countTrue(shed, fleetOn, licenseOn); n > 1 {
				return usageErrorf("--shed, --fleet and --license: give one")
			}
			if licenseOn && config != "" {
				return statusLicenseFleet(cmd.Context(), g.stdout, config, asJSON)
			}
			if licenseOn {
				if !cmd.Flags().Changed("state-file") {
					stateFile = agent.DefaultStatePath(pinPath)
				}
				return statusLicense(g.stdout, licenseStatePath(stateFile), asJSON, time.Now())
			}
			if shed {
				if !cmd.Flags().Changed("state-file") { // the one run keeps for --pin-path
					stateFile = agent.DefaultStatePath(pinPath)
				}
				return statusShed(g.stdout, stateFile, asJSON)
			}
			if fleetOn {
				return statusFleet(cmd.Context(), g.stdout, config, asJSON)
			}
			st, err := agent.ReadStatus(pinPath)
			if e := explainLayout(err, "tierlimit detach --iface IF --pin-path "+pinPath); e != nil {
				return e
			}
			if err != nil {
				return explainNotPinned(err, pinPath) // where it looked (bpffs.go)
			}
			if top < 0 {
				return usageErrorf("--top %d: want a number of groups, 0 for none", top)
			}
			var src *agent.Sources
			if top > 0 {
				s, err := agent.ReadPinnedSources(pinPath, top)
				if err != nil {
					return err
				}
				src = &s
			}
			if asJSON {
				return writeStatusJSON(g.stdout, st, src)
			}
			if err := writeStatus(g.stdout, st); err != nil {
				return err
			}
			return writeSources(g.stdout, src)
		},
	}
	cmd.Flags().StringVar(&pinPath, "pin-path", agent.DefaultPinPath, "bpffs directory of the pinned links and maps")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	cmd.Flags().IntVar(&top, "top", 0, "also list the N source groups with the most packets over budget")
	cmd.Flags().BoolVar(&shed, "shed", false, "print the open or last shedding episode")
	cmd.Flags().BoolVar(&licenseOn, "license", false, "print today's license spend, projection and pacing, from the agent's license state file")
	cmd.Flags().BoolVar(&fleetOn, "fleet", false, "list the members of the --config policy's fleet, from its store")
	cmd.Flags().StringVar(&config, "config", "", "policy file whose fleet: section names the store, for --fleet (and --license: the fleet's day from the store)")
	cmd.Flags().StringVar(&stateFile, "state-file", agent.DefaultStatePath(agent.DefaultPinPath), "the agent's episode state file, for --shed (default: the one run keeps for --pin-path)")
	return cmd
}

// statusJSON is the --json shape: stable, snake_case, counters as numbers.
type statusJSON struct {
	PinPath    string           `json:"pin_path"`
	Interfaces []pin.PinnedLink `json:"interfaces"`
	Layout     pin.Layout       `json:"layout"`
	Unread     []string         `json:"unread_maps,omitempty"`
	Policy     struct {
		Mode     string       `json:"mode"`
		WindowNs int64        `json:"window_ns"`
		Count    string       `json:"count"` // packets or bytes: the unit of the *_packets fields below and of window
		Max      uint64       `json:"max_packets"`
		Tiers    []tierJSON   `json:"tiers"`
		Table    tableJSONish `json:"table"`
	} `json:"policy"`
	Window struct {
		Packets     uint64 `json:"packets"`
		LastPackets uint64 `json:"last_packets"`
		Tier        int    `json:"tier"`
		Opened      uint64 `json:"opened"`
	} `json:"window"`
	Selected []selectedJSON `json:"selected"`
	// The payload bytes of selected packets passed and dropped
	// (bpf.Stats.PassedBytes, docs/design.md §5).
	PassedBytes  uint64            `json:"passed_bytes"`
	DroppedBytes uint64            `json:"dropped_bytes"`
	Unselected   uint64            `json:"unselected_packets"`
	Exempt       uint64            `json:"exempt_packets"`
	Fragments    map[string]uint64 `json:"fragment_packets"`
	Severity     *severityJSON     `json:"severity,omitempty"`
	Sources      *sourcesJSON      `json:"sources,omitempty"`
}

type tierJSON struct {
	Tier      int     `json:"tier"`
	Threshold uint64  `json:"threshold_packets"`
	DropRatio float64 `json:"drop_ratio"`
}

type tableJSONish struct {
	Entries int    `json:"entries"`
	Step    uint64 `json:"step_packets"`
}

type selectedJSON struct {
	Tier    int    `json:"tier"`
	Verdict string `json:"verdict"`
	Packets uint64 `json:"packets"`
	Bytes   uint64 `json:"bytes"`
}

func writeStatusJSON(w io.Writer, st agent.Status, src *agent.Sources) error {
	var out statusJSON
	out.PinPath = st.PinPath
	out.Interfaces = st.Links
	out.Layout, out.Unread = st.Layout, st.Unread
	if out.Interfaces == nil {
		out.Interfaces = []pin.PinnedLink{}
	}
	pol := st.Policy
	out.Policy.Mode = pol.Mode.String()
	out.Policy.WindowNs = pol.Window.Nanoseconds()
	out.Policy.Max = pol.Max
	out.Policy.Count = pol.Count.Unit()
	out.PassedBytes, out.DroppedBytes = st.Stats.PassedBytes(), st.Stats.Payload[tiers.VerdictDrop].Bytes
	out.Policy.Table = tableJSONish{Entries: pol.TableLen, Step: 1 << pol.Shift}
	for k := 0; k <= len(pol.Bounds); k++ {
		t := tierJSON{Tier: k, DropRatio: pol.DropRatios[k]}
		if k > 0 {
			t.Threshold = pol.Bounds[k-1]
		}
		out.Policy.Tiers = append(out.Policy.Tiers, t)
		for _, v := range tiers.Verdicts {
			c := st.Stats.Selected[k][v]
			out.Selected = append(out.Selected, selectedJSON{Tier: k, Verdict: v.String(), Packets: c.Packets, Bytes: c.Bytes})
		}
	}
	out.Window.Packets = st.WindowPackets
	out.Window.LastPackets = st.LastWindowPackets
	out.Window.Tier = st.CurrentTier
	out.Window.Opened = st.WindowsOpened
	out.Unselected = st.Stats.Unselected.Packets
	out.Exempt = st.Stats.Exempt.Packets
	out.Fragments = map[string]uint64{"pass": st.Stats.FragmentPass.Packets, "drop": st.Stats.FragmentDrop.Packets}
	out.Severity = severityStatus(st)
	out.Sources = sourcesToJSON(src)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(out)
}

func writeStatus(w io.Writer, st agent.Status) error {
	pol := st.Policy
	fmt.Fprintf(w, "pinned under %s\n\ninterfaces:\n", st.PinPath)
	if len(st.Links) == 0 {
		fmt.Fprintln(w, "  none")
	}
	for _, l := range st.Links {
		if l.Gone {
			remove := "tierlimit detach --iface " + l.Iface
			if st.PinPath != agent.DefaultPinPath {
				remove += " --pin-path " + st.PinPath
			}
			fmt.Fprintf(w, "  %s: interface gone; pinned link %d still holds program %d and the maps (%s removes it)\n",
				l.Iface, l.LinkID, l.ProgramID, remove)
			continue
		}
		fmt.Fprintf(w, "  %s (ifindex %d): %s XDP, link %d, program %d\n", l.Iface, l.Ifindex, l.Mode, l.LinkID, l.ProgramID)
	}
	writeLayoutStatus(w, st)
	fmt.Fprintf(w, "\npolicy: mode %s, window %v, max %d %s, table %d entries, step %d\n\n",
		pol.Mode, pol.Window, pol.Max, pol.Count.Unit(), pol.TableLen, uint64(1)<<pol.Shift)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "tier\tfrom n\tdrop\tpass\tdrop\twould_drop\t")
	for k := 0; k <= len(pol.Bounds); k++ {
		from := uint64(1)
		if k > 0 {
			from = pol.Bounds[k-1]
		}
		s := st.Stats.Selected[k]
		fmt.Fprintf(tw, "%d\t%d\t%s%%\t%d\t%d\t%d\t\n", k, from, strconv.FormatFloat(100*pol.DropRatios[k], 'g', 6, 64),
			s[tiers.VerdictPass].Packets, s[tiers.VerdictDrop].Packets, s[tiers.VerdictWouldDrop].Packets)
	}
	tw.Flush()
	fmt.Fprintf(w, "\nwindow: n=%d (tier %d), previous window %d %s, %d windows opened\n",
		st.WindowPackets, st.CurrentTier, st.LastWindowPackets, pol.Count.Unit(), st.WindowsOpened)
	fmt.Fprintf(w, "payload: passed %d bytes, dropped %d bytes\n", st.Stats.PassedBytes(), st.Stats.Payload[tiers.VerdictDrop].Bytes)
	fmt.Fprintf(w, "unselected %d packets, exempt %d, non-first fragments passed %d, dropped %d\n",
		st.Stats.Unselected.Packets, st.Stats.Exempt.Packets, st.Stats.FragmentPass.Packets, st.Stats.FragmentDrop.Packets)
	writeSeverityStatus(w, st)
	return nil
}

func newDetachCmd(g *globals) *cobra.Command {
	var pinPath, iface string
	var all, everything bool
	cmd := &cobra.Command{
		Use:   "detach --iface IF | --all [--everything]",
		Short: "Remove the pinned limiter from an interface (and the maps after the last)",
		Long: `detach removes tierlimit's pinned link from the interface, which detaches the
program. Once no interface is left, it removes the pinned maps too. It refuses
to touch an XDP program that is not tierlimit's.

detach --all removes what the agent of --pin-path recorded (the default pin
path unless given): its pinned links and any other attachment of its program,
on every interface of this network namespace, and its pin directory. Another
pin path's limiter (a second agent's, a test suite's) is left, and named.

detach --all --everything removes tierlimit from every interface of this
network namespace, whatever holds it (a link pinned under any path, or
netlink), and removes the pin directories of --pin-path, the default, and
every pin path an agent has used since boot (recorded under /run/tierlimit).
The package's removal runs it.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if all {
				if cmd.Flags().Changed("iface") {
					return usageErrorf("detach: --all and --iface exclude each other")
				}
				if everything {
					return detachAll(g, pinPath)
				}
				return detachPinPath(g, pinPath)
			}
			if everything {
				return usageErrorf("detach: --everything goes with --all")
			}
			if iface == "" {
				return usageErrorf("detach: --iface or --all is required")
			}
			if err := pin.Detach(pinPath, iface); err != nil {
				return explainNotPinned(explainAgent(err, pinPath, []string{iface}), pinPath)
			}
			g.logger().Info("detached", "iface", iface)
			return nil
		},
	}
	cmd.Flags().StringVar(&iface, "iface", "", "interface to detach from")
	cmd.Flags().BoolVar(&all, "all", false, "detach what --pin-path's agent recorded, from every interface, and remove its pin directory")
	cmd.Flags().BoolVar(&everything, "everything", false, "with --all: every tierlimit program of this namespace and every recorded pin directory, whoever's")
	cmd.Flags().StringVar(&pinPath, "pin-path", agent.DefaultPinPath, "bpffs directory of the pinned links and maps")
	return cmd
}

// detachPinPath is detach --all: what pinPath's agent recorded. It says
// what it left: the interfaces that still run tierlimit and the other
// recorded pin directories.
func detachPinPath(g *globals, pinPath string) error {
	others := append([]string{agent.DefaultPinPath}, pin.RecordedPinPaths()...)
	rm, left, err := pin.DetachPinPath(pinPath, others)
	log := g.logger()
	logRemoved(log, rm)
	if err != nil {
		return explainAgent(err, pinPath, nil)
	}
	if len(rm.Links)+len(rm.Netlink)+len(rm.PinDirs) == 0 {
		log.Info("nothing to detach under this pin path", "pin_path", pinPath)
	}
	for _, i := range left.Ifaces {
		log.Info("left: the interface runs another pin path's tierlimit (detach --all --pin-path P, or --everything)", "iface", i)
	}
	for _, d := range left.PinDirs {
		log.Info("left: another agent's pinned state (detach --all --pin-path P, or --everything)", "pin_path", d)
	}
	return nil
}

// logRemoved logs what a detach --all removed.
func logRemoved(log *slog.Logger, rm pin.Removed) {
	for _, l := range rm.Links {
		log.Info("detached", "iface", l.Iface, "link_id", l.LinkID, "program_id", l.ProgramID)
	}
	for _, i := range rm.Netlink {
		log.Info("detached", "iface", i, "via", "netlink")
	}
	for _, d := range rm.PinDirs {
		log.Info("removed pinned state", "pin_path", d)
	}
}

// detachAll is detach --all --everything: pin and the recorded pin paths.
func detachAll(g *globals, pinPath string) error {
	pins := append([]string{pinPath, agent.DefaultPinPath}, pin.RecordedPinPaths()...)
	rm, err := pin.DetachAll(pins)
	log := g.logger()
	logRemoved(log, rm)
	if err != nil {
		return explainAgent(err, pinPath, nil)
	}
	if len(rm.Links)+len(rm.Netlink)+len(rm.PinDirs) == 0 {
		log.Info("nothing to detach: no tierlimit program on this namespace's interfaces, no pinned state")
	}
	return nil
}

// writeLayoutStatus says which layout the maps are pinned in, when it is
// older than this binary's: the next agent migrates it (docs/design.md §11).
func writeLayoutStatus(w io.Writer, st agent.Status) {
	if st.Layout.Recorded && st.Layout.Version == bpf.Layout {
		return
	}
	fmt.Fprintf(w, "\nlayout %s, older than this version's %d: the next agent migrates it in place", st.Layout, bpf.Layout)
	if len(st.Unread) > 0 {
		fmt.Fprintf(w, "; not readable here: %s", strings.Join(st.Unread, ", "))
	}
	fmt.Fprintln(w)
}

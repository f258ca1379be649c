package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/tierlimit/tierlimit/agent"
	"github.com/tierlimit/tierlimit/internal/sandbox"
	"github.com/tierlimit/tierlimit/tiers"
)

// The fleet demo's timing: each member reports every demoFleetReport and
// leaves after demoFleetTTL without a report.
const (
	demoFleetReport = 100 * time.Millisecond
	demoFleetTTL    = time.Second
)

// demoFleetWeights are the members' shares of the fleet's load: 60/30/10
// for three, else n, n-1, ..., 1.
func demoFleetWeights(n int) []int {
	if n == 3 {
		return []int{6, 3, 1}
	}
	w := make([]int, n)
	for i := range w {
		w[i] = n - i
	}
	return w
}

// demoFleetPolicy is the fleet demo's policy: the seed's tiers for
// fleet.max = --max per --window, smooth, UDP 514; each member's own max
// (its fallback with the store gone for ttl before any member count) is
// --max ÷ members.
func demoFleetPolicy(f demoFlags, store string) string {
	own := max(f.max/uint64(f.fleet), 1)
	var tiersYAML []string
	for _, t := range tiers.Default().Tiers {
		tiersYAML = append(tiersYAML, fmt.Sprintf("{at: %s, drop: %s}", t.At, t.Drop))
	}
	return fmt.Sprintf(`mode: enforce
shape: smooth
window: %s
max: %d
tiers: [%s]
select: [{proto: udp, ports: [514]}]
fleet: {name: tldemo, store: %q, max: %d, report: %s, ttl: %s, fallback: share}
`, f.window, own, strings.Join(tiersYAML, ", "), store, f.max, demoFleetReport, demoFleetTTL)
}

// runFleetDemo runs --fleet N: a store (redis-server, or valkey-server)
// in a namespace of its own, N members each running `tierlimit run` in
// its collector namespace joined to the store's, each flooded by its own
// sender; per window the load (a multiple of fleet.max, split across the
// members by demoFleetWeights), each member's offered and passed, and the
// fleet's passes beside the model's P(R_fleet) and what a static split of
// max ÷ N on each would pass.
func runFleetDemo(ctx context.Context, g *globals, f demoFlags) error {
	if os.Geteuid() != 0 {
		return agent.ErrNotRoot
	}
	server, err := storeServer()
	if err != nil {
		return err
	}
	if _, err := exec.LookPath("nft"); f.chaos && err != nil {
		return errors.New("demo --fleet --chaos needs nft installed, to cut a member off from the store (apt install nftables)")
	}
	bin, err := fleetDemoBin(f)
	if err != nil {
		return err
	}
	lab, err := newFleetLab("tldemo", bin, f.fleet)
	if err != nil {
		return fmt.Errorf("sandbox: %w", err)
	}
	defer lab.Close()
	store, err := startDemoStore(lab, server)
	if err != nil {
		return err
	}
	defer store.stop()
	url := "redis://" + net.JoinHostPort(lab.net.StoreAddr.String(), "6379")
	text := demoFleetPolicy(f, url)
	cfg, err := lab.writePolicy("fleet.yaml", text)
	if err != nil {
		return err
	}
	m, err := newFleetDemoModel(text)
	if err != nil {
		return err
	}
	for i := range lab.members {
		if err := lab.start(i, fmt.Sprintf("m%d", i), cfg, "joined the fleet"); err != nil {
			return err
		}
	}
	w := demoFleetWeights(f.fleet)
	out := g.stdout
	fmt.Fprintf(out, "fleet demo: %d members in namespaces, each running tierlimit run against %s (%s) in a namespace of its own\n",
		f.fleet, url, server)
	fmt.Fprintf(out, "policy: fleet.max %d per %s across the fleet, report %s, ttl %s; each member judges on its own R̂ + the others' last reported sum\n",
		f.max, f.window, demoFleetReport, demoFleetTTL)
	fmt.Fprintf(out, "load: each window's offered load, a multiple of fleet.max, split %s across the members\n\n", shareText(w, sumOf(w)))
	var chaos demoChaos
	chaosErr := make(chan error, 1)
	stop := make(chan struct{})
	if f.chaos {
		chaos = chaosWindows(len(f.loads))
		go func() { chaosErr <- chaos.run(lab, time.Now(), f.window, stop) }()
	}
	sent, err := lab.flood(ctx, 0, len(f.loads), f.window, fleetDemoRates(f, w))
	close(stop)
	if f.chaos {
		if cerr := <-chaosErr; cerr != nil && err == nil {
			err = cerr
		}
	}
	if err != nil {
		return fmt.Errorf("flood: %w", err)
	}
	lab.settle(100 * time.Millisecond)
	if f.chaos {
		pol, err := tiers.ParseYAML([]byte(text))
		if err != nil {
			return configError{err}
		}
		return m.printChaos(out, lab, pol, f.loads, sent, chaos, f.window)
	}
	return m.print(out, lab, f.loads, sent)
}

// fleetDemoBin is the tierlimit binary the members run: --fleet-bin, or
// this one.
func fleetDemoBin(f demoFlags) (string, error) {
	if f.fleetBin != "" {
		return f.fleetBin, nil
	}
	bin, err := os.Executable()
	if err != nil {
		return "", fmt.Errorf("demo --fleet: the tierlimit binary the members run: %w", err)
	}
	return bin, nil
}

// fleetDemoRates is the members' rates in window k: the window's load, a
// multiple of fleet.max, split by the weights w.
func fleetDemoRates(f demoFlags, w []int) func(k int) []int {
	sum := sumOf(w)
	return func(k int) []int {
		total := f.loads[k] * float64(f.max)
		out := make([]int, len(w))
		for i, v := range w {
			out[i] = int(total * float64(v) / float64(sum))
		}
		return out
	}
}

func sumOf(w []int) int {
	sum := 0
	for _, v := range w {
		sum += v
	}
	return sum
}

// fleetDemoModel is what the fleet demo compares the members' passes
// with: the fleet's table (one limiter of fleet.max) and the static
// split's (each member on its own max).
type fleetDemoModel struct {
	tab, stab tiers.Table
	static    tiers.Policy
}

// newFleetDemoModel compiles the demo's policy text and its static split.
// Returns a configError when either does not compile.
func newFleetDemoModel(text string) (fleetDemoModel, error) {
	pol, err := tiers.ParseYAML([]byte(text))
	if err != nil {
		return fleetDemoModel{}, configError{err}
	}
	tab, err := tiers.Compile(pol, 0)
	if err != nil {
		return fleetDemoModel{}, configError{err}
	}
	static := pol.Local()
	stab, err := tiers.Compile(static, 0)
	if err != nil {
		return fleetDemoModel{}, configError{err}
	}
	return fleetDemoModel{tab: tab, stab: stab, static: static}, nil
}

// print writes the table of the windows: each member's passed and
// offered (sent), the fleet's, and the models'.
func (m fleetDemoModel) print(out io.Writer, lab *fleetLab, loads []float64, sent [][]int) error {
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', tabwriter.AlignRight)
	head := "window\tload\t"
	for i := range lab.members {
		head += fmt.Sprintf("m%d passed/offered\t", i)
	}
	fmt.Fprintln(tw, head+"fleet offered\tfleet passed\tmodel P(R_fleet)\tstatic max÷N\t")
	for k, load := range loads {
		row := fmt.Sprintf("%d\t%g×\t", k+1, load)
		off, pass := 0, 0
		var staticP float64
		for i := range lab.members {
			p := lab.passed(i, k)
			row += fmt.Sprintf("%d/%d\t", p, sent[i][k])
			off += sent[i][k]
			pass += p
			staticP += m.stab.Expected(uint64(sent[i][k])).Passed
		}
		fmt.Fprintf(tw, "%s%d\t%d\t%.0f\t%.0f\t\n", row, off, pass, m.tab.Expected(uint64(off)).Passed, staticP)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(out, "\nmodel P(R_fleet): what one limiter of fleet.max passes of the fleet's whole load; static max÷N: what the members would pass with fleet off and max %d each\n", m.static.Max)
	return nil
}

func shareText(w []int, sum int) string {
	var parts []string
	for _, v := range w {
		parts = append(parts, fmt.Sprintf("%.0f", 100*float64(v)/float64(sum)))
	}
	return strings.Join(parts, "/") + " %"
}

// storeServer finds the store's server: redis-server, else valkey-server.
func storeServer() (string, error) {
	for _, name := range []string{"redis-server", "valkey-server"} {
		if p, err := exec.LookPath(name); err == nil {
			return p, nil
		}
	}
	return "", errors.New("demo --fleet needs redis-server or valkey-server installed (apt install redis-server)")
}

// demoStore is the store's server process in the lab's store namespace.
type demoStore struct {
	cmd  *exec.Cmd
	done chan struct{}
	out  *lockedBuffer
}

// startDemoStore runs server in the lab's store namespace on
// StoreAddr:6379, without persistence, and waits (bounded) until it
// answers.
func startDemoStore(lab *fleetLab, server string) (*demoStore, error) {
	addr := net.JoinHostPort(lab.net.StoreAddr.String(), "6379")
	s := &demoStore{done: make(chan struct{}), out: &lockedBuffer{}}
	s.cmd = lab.net.Store.Command(context.Background(), server, "--bind", lab.net.StoreAddr.String(), "--port", "6379",
		"--dir", lab.dir, "--save", "", "--appendonly", "no", "--daemonize", "no", "--protected-mode", "no", "--logfile", "")
	s.cmd.Stdout, s.cmd.Stderr = s.out, s.out
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := s.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", server, err)
	}
	go func() { s.cmd.Wait(); close(s.done) }()
	for end := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if pingStore(lab.net.Store, addr) {
			return s, nil
		}
		select {
		case <-s.done:
			return nil, fmt.Errorf("%s exited at start: %s", server, s.out)
		default:
		}
		if time.Now().After(end) {
			s.stop()
			return nil, fmt.Errorf("%s on %s did not answer within 10s: %s", server, addr, s.out)
		}
	}
}

// pingStore reports whether the server at addr in ns answers PING.
func pingStore(ns *sandbox.NS, addr string) bool {
	var c net.Conn
	if err := ns.Do(func() (err error) {
		c, err = net.DialTimeout("tcp", addr, time.Second)
		return err
	}); err != nil {
		return false
	}
	return sandbox.RedisUp(c, false)
}

// stop ends the store's server and waits for it.
func (s *demoStore) stop() {
	s.cmd.Process.Kill()
	<-s.done
}

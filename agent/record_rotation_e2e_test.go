package agent_test

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/agent/attach"
	"github.com/tierlimit/tierlimit/agent/record"
	"github.com/tierlimit/tierlimit/internal/testenv"
	"github.com/tierlimit/tierlimit/tiers"
)

// dirState is one look at the record dir: its files, oldest first, and
// the bytes they take.
type dirState struct {
	names []string
	bytes uint64
}

// lookDir lists dir's record files; any goroutine may call it.
func lookDir(dir string) (dirState, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return dirState{}, fmt.Errorf("record dir: %w", err)
	}
	var s dirState
	for _, e := range ents {
		if !strings.HasSuffix(e.Name(), ".pcapng") {
			continue
		}
		fi, err := e.Info()
		if err != nil {
			continue // removed since the listing
		}
		s.names = append(s.names, e.Name())
		s.bytes += uint64(fi.Size())
	}
	slices.Sort(s.names)
	return s, nil
}

// checkRecordFile reads a record file with tshark and gopacket: as many
// packets in each, every comment one of a sample of src shed by its tier.
func checkRecordFile(path string, src netip.Addr) error {
	comments, err := testenv.TsharkComments(path)
	if err != nil {
		return err
	}
	packets, _, err := pcapFile(path)
	if err != nil {
		return err
	}
	if len(comments) != packets || packets == 0 {
		return fmt.Errorf("%s: tshark read %d packet comments, gopacket %d packets", path, len(comments), packets)
	}
	for _, c := range comments {
		kv, err := record.ParseSampleComment(c)
		if err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		if kv["group"] != src.String()+"/32" || kv["reason"] != "tier" || kv["verdict"] != "drop" {
			return fmt.Errorf("%s: comment %q, want the flood's source shed by its tier", path, c)
		}
	}
	return nil
}

// rotationWatch looks at the record dir every second while the flood
// lasts (run): the bytes it holds against max_bytes, the files removed
// oldest first. Meanwhile check reads the newest closed file it has not
// read with tshark (checkRecordFile), so that few are left to read after
// the flood.
type rotationWatch struct {
	t        *testing.T
	dir      string
	maxBytes uint64
	src      netip.Addr

	mu      sync.Mutex
	looks   int
	most    uint64
	seen    map[string]bool
	checked map[string]bool
}

func (w *rotationWatch) run(stop <-chan struct{}) {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return
		case <-tick.C:
		}
		s, err := lookDir(w.dir)
		if err != nil {
			w.t.Error(err)
			continue
		}
		w.look(s)
	}
}

func (w *rotationWatch) check(stop <-chan struct{}) {
	for {
		select {
		case <-stop:
			return
		case <-time.After(100 * time.Millisecond):
		}
		s, err := lookDir(w.dir)
		// The newest closed file lives while the 7 after it fill.
		if n := len(s.names); err != nil || n < 2 || w.isChecked(s.names[n-2]) {
			continue
		}
		name := s.names[len(s.names)-2]
		if err := checkRecordFile(filepath.Join(w.dir, name), w.src); err != nil {
			w.t.Error(err)
		}
		w.mu.Lock()
		w.checked[name] = true
		w.mu.Unlock()
	}
}

func (w *rotationWatch) isChecked(name string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.checked[name]
}

func (w *rotationWatch) look(s dirState) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.looks++
	w.most = max(w.most, s.bytes)
	if s.bytes > w.maxBytes {
		w.t.Errorf("after %d s: the record dir holds %d bytes in %d files, over max_bytes %d", w.looks, s.bytes, len(s.names), w.maxBytes)
	}
	// Oldest first: every file gone is older than every file left.
	for n := range w.seen {
		if !slices.Contains(s.names, n) && len(s.names) > 0 && n > s.names[0] {
			w.t.Errorf("after %d s: %s removed before the older %s", w.looks, n, s.names[0])
		}
	}
	for _, n := range s.names {
		w.seen[n] = true
	}
}

// TestRecordRotationFlood floods the collector veth for 20 s (60 s under
// TIERLIMIT_SOAK=1) with the record at 500 samples/s into a dir of
// max_bytes 1 MiB (the least; about 8 s of samples, so 20 s turns the dir
// over more than twice): looked at every second, the dir never holds more than
// max_bytes, and the files removed are always the oldest; every file left
// at the end, and closed ones read while the flood lasts, open in tshark,
// which reads as many packets as gopacket, and every packet comment parses
// and names the flood's source.
func TestRecordRotationFlood(t *testing.T) {
	testenv.Require(t)
	testenv.RequireTshark(t)
	const (
		samples  = 500
		maxBytes = tiers.MinRecordMaxBytes
	)
	flood := testenv.Soak(20*time.Second, 60*time.Second)
	p := newPair(t)
	dir := filepath.Join(t.TempDir(), "shed")
	pol := recordPolicy(t, dir, "")
	pol.Record = tiers.Record{Samples: samples, Snaplen: tiers.RecordSnapMax, Dir: dir, MaxBytes: maxBytes}
	a := startAgent(t, p, attach.XDPAuto, pol)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if _, err := a.StartRecord(ctx, pol, ""); err != nil {
		t.Fatal(err)
	}
	ping(t, p.Send, p.CollAddr.String(), 1, "0.2")

	w := &rotationWatch{t: t, dir: dir, maxBytes: maxBytes, src: p.SendAddr, seen: map[string]bool{}, checked: map[string]bool{}}
	stop := make(chan struct{})
	var watching sync.WaitGroup
	watching.Add(2)
	go func() { defer watching.Done(); w.run(stop) }()
	go func() { defer watching.Done(); w.check(stop) }()
	floodFrom(t, p, []netip.Addr{p.SendAddr}, []int{2000}, flood)
	close(stop)
	watching.Wait()
	time.Sleep(300 * time.Millisecond) // the last samples read

	final, err := lookDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	w.look(final)
	m := gather(t, a)
	written, lost := m.sum("tierlimit_shed_samples_total", `result="written"`), m.sum("tierlimit_shed_samples_total", `result="lost"`)
	t.Logf("%d looks: at most %d bytes; %d files made, %d read during the flood, %d left (%d bytes); samples written %v, lost %v",
		w.looks, w.most, len(w.seen), len(w.checked), len(final.names), final.bytes, written, lost)
	// The dir holds about 8 files (8 s): 20 s turns it over at least
	// twice, 60 s at least 3 times.
	turns := 2
	if flood > 30*time.Second {
		turns = 3
	}
	if w.looks < int(flood.Seconds())-5 || len(w.seen) < turns*8 || written < samples*flood.Seconds()/2 || lost != 0 {
		t.Errorf("%d looks, %d files made, %v samples written, %v lost: want a look a second, the dir rotated through at least %d times, half the cap's %d/s written, none lost",
			w.looks, len(w.seen), written, lost, turns, samples)
	}
	start := time.Now()
	var wg sync.WaitGroup
	sem := make(chan struct{}, 2)
	for _, n := range final.names {
		if w.checked[n] {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			if err := checkRecordFile(filepath.Join(dir, n), p.SendAddr); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	t.Logf("the files left read in %v", time.Since(start).Round(time.Millisecond))
}

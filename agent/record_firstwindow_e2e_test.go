package agent_test

import (
	"context"
	"fmt"
	"net/netip"
	"path/filepath"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/agent/attach"
	"github.com/tierlimit/tierlimit/internal/testenv"
	"github.com/tierlimit/tierlimit/tiers"
)

// TestRecordFirstWindowSamples sends 60 datagrams at once from one source
// into max 20 (the smooth shape, as `run` gets by default), in enforce and
// in dry-run: the episode that opens a tick after that window counts its
// shed packets and must count its samples too. Its close report names the
// source and counts every sample written, not 0 (the samples of the
// window that opened the episode were reset by the opening).
func TestRecordFirstWindowSamples(t *testing.T) {
	testenv.Require(t)
	for _, mode := range []tiers.Mode{tiers.ModeEnforce, tiers.ModeDryRun} {
		t.Run(mode.String(), func(t *testing.T) {
			p := newPair(t)
			src := netip.MustParseAddr("198.51.100.11")
			testenv.AddAddr(t, p.Send, p.SendIf, netip.PrefixFrom(src, 32))
			addr, reports := listenReports(t)
			pol := recordPolicy(t, filepath.Join(t.TempDir(), "shed"), "udp://"+addr)
			pol.Max, pol.Shape, pol.Mode = 20, tiers.ShapeSmooth, mode
			if err := pol.Validate(); err != nil {
				t.Fatal(err)
			}
			a := startAgent(t, p, attach.XDPAuto, pol)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			ep, err := a.StartRecord(ctx, pol, filepath.Join(t.TempDir(), "episode.json"))
			if err != nil {
				t.Fatal(err)
			}
			ping(t, p.Send, p.CollAddr.String(), 1, "0.2")

			tx := testenv.NewSenderFrom(t, p.Send, src, netip.AddrPortFrom(p.CollAddr, 514))
			if n, err := tx.Pace(ctx, 60, time.Millisecond, time.Second, func(i int) []byte { return testenv.SyslogMessage(1, i) }); n != 60 || err != nil {
				t.Fatalf("sent %d of 60: %v", n, err)
			}
			deadline := time.Now().Add(10 * time.Second)
			for (ep.Current().ID == 0 || ep.Current().Open) && time.Now().Before(deadline) {
				time.Sleep(100 * time.Millisecond)
			}
			time.Sleep(200 * time.Millisecond) // the close report's datagram
			reps := reports()
			if len(reps) == 0 || reps[len(reps)-1].event != "close" {
				t.Fatalf("reports %v, want an episode closed", reps)
			}
			close := reps[len(reps)-1].params
			m := gather(t, a)
			written := m.sum("tierlimit_shed_samples_total", `result="written"`)
			t.Logf("close: shed=%s samples=%s top_sampled=%q; samples written %v", close["shed"], close["samples"], close["top_sampled"], written)
			if close["shed"] == "0" || close["shed"] == "" || written == 0 {
				t.Fatalf("shed %s, samples written %v: want a flood that sheds and samples", close["shed"], written)
			}
			if want := fmt.Sprint(written); close["samples"] != want {
				t.Errorf("close report: samples=%s, want the %s written in the episode", close["samples"], want)
			}
			if want := fmt.Sprintf("%s/32:1.0000", src); close["top_sampled"] != want {
				t.Errorf("close report: top_sampled=%q, want %q", close["top_sampled"], want)
			}
			if c := ep.Current(); c.Samples == 0 || len(c.Top) != 1 || c.Top[0].Group != netip.PrefixFrom(src, 32) {
				t.Errorf("the episode: samples %d top %v, want the source's", c.Samples, c.Top)
			}
		})
	}
}

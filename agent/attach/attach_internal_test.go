package attach

import (
	"errors"
	"log/slog"
	"testing"

	"github.com/tierlimit/tierlimit/agent/pin"
	"github.com/tierlimit/tierlimit/internal/testenv"
)

// TestAttachRaceIsBusy (issue 11 D): an agent that found the interface free
// and then lost the race to attach (the kernel answers EBUSY or EEXIST) says
// that another agent holds the interface, not "create link: file exists".
func TestAttachRaceIsBusy(t *testing.T) {
	testenv.Require(t)
	p := testenv.NewPair(t)
	first := New(Config{Interfaces: []string{p.CollIf}})
	if err := p.Coll.Do(func() error {
		links, err := first.Resolve()
		if err == nil {
			_, err = first.Load()
		}
		if err == nil {
			err = first.AttachAll(links)
		}
		return err
	}); err != nil {
		first.Abort()
		t.Fatal(err)
	}
	defer first.Close()
	for _, mode := range []XDPMode{XDPAuto, XDPNative, XDPGeneric} {
		// The loser: same kind of program, past its check for a program
		// on the interface.
		loser := &linker{env: &env{cfg: Config{XDPMode: mode}, log: slog.New(slog.DiscardHandler), lim: first.lim, nh: first.nh}}
		err := p.Coll.Do(func() error {
			l, err := first.nh.LinkByName(p.CollIf)
			if err != nil {
				return err
			}
			return loser.attachMode(&Attachment{Iface: p.CollIf, Index: l.Attrs().Index}, l)
		})
		var busy *pin.BusyError
		if !errors.As(err, &busy) || busy.Iface != p.CollIf {
			t.Errorf("%s: lost attach race: %v, want a BusyError for %s", mode, err, p.CollIf)
		}
	}
}

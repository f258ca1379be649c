package attach

import (
	"errors"
	"fmt"
	"os"

	"github.com/cilium/ebpf/link"

	"github.com/tierlimit/tierlimit/agent/pin"
	"github.com/tierlimit/tierlimit/bpf"
)

// pins are the pins of one run under the pin directory: the links, the
// program, the layout record, and an older layout's state carried over.
// Every method but startMigration and finish runs with the Attacher's mu
// held; without a pin directory there is nothing to pin.
type pins struct {
	*env
	// migration carries an older layout's pinned state during the start.
	migration *bpf.Migration
	// lost: Watch logged the pinned state as gone.
	lost bool
}

// startMigration carries an older layout's pinned state into the maps of
// the loaded program (pin.Dir.StartMigration); nothing when there is none.
func (p *pins) startMigration() (err error) {
	if p.pd != nil && p.pd.Migrate != nil {
		p.migration, err = p.pd.StartMigration(p.lim)
	}
	return err
}

// finish pins the migrated maps, the program and the layout record once
// every link of attached runs the program, and warns of the pinned links
// of interfaces this run was not given.
func (p *pins) finish(attached []*Attachment) error {
	if p.pd == nil {
		return nil
	}
	if p.migration != nil {
		err := p.pd.FinishMigration(p.lim, p.migration, p.log)
		p.migration = nil
		if err != nil {
			return err
		}
	}
	if err := p.pd.PinProgram(p.lim.Program(), p.lim.JumpTable(), p.lim.Globals()); err != nil {
		return err
	}
	if err := pin.WriteLayout(p.pd.Path(), p.cfg.Version); err != nil {
		return err
	}
	p.warnOtherLinks(attached)
	return nil
}

// abort closes a migration that a failed start left open.
func (p *pins) abort() {
	if p.migration != nil {
		p.migration.Close()
	}
}

// warnOtherLinks logs the interfaces that a pinned link from an earlier run
// still limits although this run was not asked to: they share this run's
// maps and policy, and only detaching them removes them.
func (p *pins) warnOtherLinks(attached []*Attachment) {
	entries, _ := os.ReadDir(p.pd.Links())
	for _, e := range entries {
		iface := pin.UnpinName(e.Name())
		mine := false
		for _, att := range attached {
			mine = mine || att.Iface == iface
		}
		if !mine {
			p.log.Warn("interface still limited by a pinned link from an earlier run", "iface", iface, "pin", p.pd.Path())
		}
	}
}

// pinLink pins att's link under the pin directory, when pinning.
func (p *pins) pinLink(att *Attachment) error {
	if p.pd == nil || att.link == nil {
		return nil
	}
	if err := att.link.Pin(p.pd.LinkPin(att.Iface)); err != nil {
		att.link.Close()
		att.link = nil
		return fmt.Errorf("pin link: %w", err)
	}
	return nil
}

// unpinIfMine removes att's link pin if it holds att's link.
func (p *pins) unpinIfMine(att *Attachment) {
	if p.linkPinned(att) {
		_ = os.Remove(p.pd.LinkPin(att.Iface))
	}
}

// linkPinned reports whether att's link is pinned where it belongs.
func (p *pins) linkPinned(att *Attachment) bool {
	if p.pd == nil || att.link == nil {
		return false
	}
	lk, err := link.LoadPinnedLink(p.pd.LinkPin(att.Iface), nil)
	if err != nil {
		return false
	}
	defer lk.Close()
	return linkID(lk) == att.LinkID
}

// check pins the maps, links and program again when the pin directory or
// anything in it was removed under the running agent. healthy says
// whether an attachment runs the limiter (Attacher.check).
func (p *pins) check(attached []*Attachment, healthy func(*Attachment) bool) {
	_, perr := os.Stat(p.pd.Program())
	// The judgement's program array too: pinned from another run, this
	// run's would empty when the agent exits.
	intact := p.pd.Intact() && perr == nil && p.lim.JumpPinned(p.pd.Jump()) && p.lim.PinnedMaps(p.pd.Maps())
	for _, att := range attached {
		if att.link != nil && healthy(att) && !p.linkPinned(att) {
			intact = false
		}
	}
	if intact {
		return
	}
	if !p.lost {
		p.log.Error("pinned state removed while the agent runs: pinning it again from the agent's fds", "pin", p.pd.Path())
	}
	if err := p.repin(attached, healthy); err != nil {
		if !p.lost {
			p.log.Error("pinning again failed: the limiter ends when the agent exits", "pin", p.pd.Path(), "error", err)
		}
		p.lost = true
		return
	}
	p.lost = false
	p.log.Info("pinned state restored", "pin", p.pd.Path())
}

func (p *pins) repin(attached []*Attachment, healthy func(*Attachment) bool) error {
	if !p.pd.Intact() {
		if err := p.pd.Relock(); err != nil {
			return err
		}
	} else if err := p.pd.MakeSubdirs(); err != nil {
		return err
	}
	if err := p.lim.Repin(p.pd.Maps()); err != nil {
		return err
	}
	for _, att := range attached {
		if att.link == nil || !healthy(att) || p.linkPinned(att) {
			continue
		}
		path := p.pd.LinkPin(att.Iface)
		if err := att.link.Unpin(); err != nil {
			return err
		}
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
		if err := att.link.Pin(path); err != nil {
			return fmt.Errorf("pin link %s: %w", path, err)
		}
	}
	if err := p.pd.PinProgram(p.lim.Program(), p.lim.JumpTable(), p.lim.Globals()); err != nil {
		return err
	}
	return pin.WriteLayout(p.pd.Path(), p.cfg.Version)
}

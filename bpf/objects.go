package bpf

import (
	"fmt"
	"reflect"

	"github.com/cilium/ebpf"
)

// loadAssign loads spec into objs. An object of an earlier build (the
// benchmarks' baselines, testdata/layout-*) may lack maps and variables
// this build declares (tl_fleet_others came with the fleet, smooth_prof
// with layout 3): its programs are assigned, and of its maps and
// variables (and programs: tl_judge_tail came with the judgement's tail
// call) those it has; the others stay nil, and what needs them
// returns ErrPolicy (fleet.go). Such a Limiter is for BPF_PROG_TEST_RUN
// only: it cannot be pinned.
//
// bss is set to the program's .bss map (its globals, the source sketch
// among them: Limiter.Globals), nil for an object without one.
func loadAssign(spec *ebpf.CollectionSpec, copts *ebpf.CollectionOptions, objs *LimiterObjects, bss **ebpf.Map) error {
	maps := reflect.ValueOf(&objs.LimiterMaps).Elem()
	vars := reflect.ValueOf(&objs.LimiterVariables).Elem()
	if spec.Maps[bssSection] != nil && hasAll(maps, func(n string) bool { return spec.Maps[n] != nil }) &&
		hasAll(vars, func(n string) bool { return spec.Variables[n] != nil }) {
		var all struct {
			LimiterObjects
			Bss *ebpf.Map `ebpf:".bss"`
		}
		if err := spec.LoadAndAssign(&all, copts); err != nil {
			return err
		}
		*objs, *bss = all.LimiterObjects, all.Bss
		return nil
	}
	coll, err := ebpf.NewCollectionWithOptions(spec, *copts)
	if err != nil {
		return err
	}
	if m, ok := coll.Maps[bssSection]; ok {
		*bss = m
		delete(coll.Maps, bssSection) // the Limiter owns it now
	}
	progs := reflect.ValueOf(&objs.LimiterPrograms).Elem()
	for i := range progs.NumField() {
		name := progs.Type().Field(i).Tag.Get("ebpf")
		if p, ok := coll.Programs[name]; ok {
			progs.Field(i).Set(reflect.ValueOf(p))
			delete(coll.Programs, name) // objs owns it now
		}
	}
	if objs.Tierlimit == nil {
		coll.Close()
		return fmt.Errorf("object has no program %q", LimiterProgTierlimit)
	}
	for i := range maps.NumField() {
		name := maps.Type().Field(i).Tag.Get("ebpf")
		if m, ok := coll.Maps[name]; ok {
			maps.Field(i).Set(reflect.ValueOf(m))
			delete(coll.Maps, name) // objs owns it now
		}
	}
	for i := range vars.NumField() {
		if v, ok := coll.Variables[vars.Type().Field(i).Tag.Get("ebpf")]; ok {
			vars.Field(i).Set(reflect.ValueOf(v))
		}
	}
	return nil
}

// bssSection is the name of the program's map of its zeroed globals.
const bssSection = ".bss"

// hasAll reports whether has holds for the ebpf tag of every field of v.
func hasAll(v reflect.Value, has func(name string) bool) bool {
	for i := range v.NumField() {
		if !has(v.Type().Field(i).Tag.Get("ebpf")) {
			return false
		}
	}
	return true
}

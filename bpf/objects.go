package bpf

import (
	"reflect"

	"github.com/cilium/ebpf"
)

// loadAssign loads spec into objs. An object of an earlier build (the
// benchmarks' baselines, testdata/layout-*) may lack variables this build
// declares (tl_fleet_others came with the fleet): its programs and maps
// are assigned, and of its variables those it has; the others stay nil,
// and what needs them returns ErrPolicy (fleet.go).
func loadAssign(spec *ebpf.CollectionSpec, copts *ebpf.CollectionOptions, objs *LimiterObjects) error {
	vars := reflect.ValueOf(&objs.LimiterVariables).Elem()
	missing := false
	for i := range vars.NumField() {
		if _, ok := spec.Variables[vars.Type().Field(i).Tag.Get("ebpf")]; !ok {
			missing = true
		}
	}
	if !missing {
		return spec.LoadAndAssign(objs, copts)
	}
	coll, err := ebpf.NewCollectionWithOptions(spec, *copts)
	if err != nil {
		return err
	}
	if err := coll.Assign(&struct {
		*LimiterPrograms
		*LimiterMaps
	}{&objs.LimiterPrograms, &objs.LimiterMaps}); err != nil {
		coll.Close()
		return err
	}
	for i := range vars.NumField() {
		if v, ok := coll.Variables[vars.Type().Field(i).Tag.Get("ebpf")]; ok {
			vars.Field(i).Set(reflect.ValueOf(v))
		}
	}
	return nil
}

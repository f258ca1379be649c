package tiers

import (
	"slices"
	"testing"
)

func TestEmptyTiers(t *testing.T) {
	for _, c := range []struct {
		bounds []uint64
		want   []int
	}{
		{[]uint64{28000, 32000, 40000}, nil},
		{[]uint64{1, 1, 3}, []int{0, 1}},
		{[]uint64{0, 2, 2}, []int{0, 2}},
		{[]uint64{5, 5, 5}, []int{1, 2}},
	} {
		if got := EmptyTiers(Table{Bounds: c.bounds}); !slices.Equal(got, c.want) {
			t.Errorf("EmptyTiers(%v) = %v, want %v", c.bounds, got, c.want)
		}
	}
}

package workloads_test

import (
	"k8s.io/apimachinery/pkg/api/resource"
)

func resourceQ(s string) *resource.Quantity {
	q := resource.MustParse(s)
	return &q
}

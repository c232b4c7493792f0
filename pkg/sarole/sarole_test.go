package sarole

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/cistern-csi/cistern/pkg/datasource/source"
)

func TestRoleARN(t *testing.T) {
	sa := func(name string, annotations map[string]string) *corev1.ServiceAccount {
		return &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: name, Annotations: annotations}}
	}
	client := fake.NewClientset(
		sa("cistern", map[string]string{"cistern.csi.dev/role-arn": "arn:aws:iam::1:role/ours", "eks.amazonaws.com/role-arn": "arn:aws:iam::1:role/irsa"}),
		sa("irsa", map[string]string{"eks.amazonaws.com/role-arn": "arn:aws:iam::1:role/irsa"}),
		sa("plain", nil),
	)
	client.PrependReactor("get", "serviceaccounts", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.(k8stesting.GetAction).GetName() == "secret-team" {
			return true, nil, apierrors.NewForbidden(schema.GroupResource{Resource: "serviceaccounts"}, "secret-team", nil)
		}
		return false, nil, nil
	})
	r := Reader{Client: client.CoreV1()}
	for _, tc := range []struct {
		name, sa, want string
		kind           source.Kind
		fails          bool
	}{
		{name: "cistern annotation first", sa: "cistern", want: "arn:aws:iam::1:role/ours"},
		{name: "IRSA annotation", sa: "irsa", want: "arn:aws:iam::1:role/irsa"},
		{name: "no annotation", sa: "plain", want: ""},
		{name: "failure case - no such ServiceAccount", sa: "ghost", fails: true, kind: source.Invalid},
		{name: "failure case - forbidden", sa: "secret-team", fails: true, kind: source.Invalid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := r.RoleARN(context.Background(), "team-a", tc.sa)
			if tc.fails {
				if err == nil || source.KindOf(err) != tc.kind {
					t.Fatalf("got %q, %v; want a %v error", got, err, tc.kind)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("got %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

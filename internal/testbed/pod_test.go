package testbed

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// TestPodLoopbackIsThePods: a port a container listens on on loopback
// alone is its pod's own, as on a node, so two pods of one spec never
// meet on this host's loopback; a service of the host the arguments name
// on loopback stays where it is.
func TestPodLoopbackIsThePods(t *testing.T) {
	spec := corev1.PodSpec{Containers: []corev1.Container{
		{Name: "server", Command: []string{"/kopia"}, Args: []string{"server", "start", "--address=127.0.0.1:51517"},
			Ports: []corev1.ContainerPort{{ContainerPort: 51515}}},
		{Name: "sidecar", Command: []string{"/sync"}, Args: []string{"--server-url=https://127.0.0.1:51517", "--s3-endpoint=127.0.0.1:9000"}},
	}}
	rewritten := func() (server, sidecar []string) {
		r := &podRunner{o: PodOptions{Spec: spec}}
		if err := r.allocatePorts(); err != nil {
			t.Fatal(err)
		}
		var out [2][]string
		for i, c := range spec.Containers {
			rewrite, err := r.rewriter(c)
			if err != nil {
				t.Fatal(err)
			}
			for _, a := range c.Args {
				out[i] = append(out[i], rewrite(a))
			}
		}
		return out[0], out[1]
	}
	server1, sidecar1 := rewritten()
	server2, _ := rewritten()
	if server1[2] == "--address=127.0.0.1:51517" || server1[2] == server2[2] {
		t.Errorf("two pods listen on %s and %s: want each its own port", server1[2], server2[2])
	}
	if want := "--server-url=https://" + server1[2][len("--address="):]; sidecar1[0] != want {
		t.Errorf("the sidecar reaches %s, want %s (its pod's server)", sidecar1[0], want)
	}
	if sidecar1[1] != "--s3-endpoint=127.0.0.1:9000" {
		t.Errorf("a service of the host was moved: %s", sidecar1[1])
	}
}

package scheduler

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/cache"
)

func cacheTombstone(p *corev1.Pod) any {
	return cache.DeletedFinalStateUnknown{Key: p.Namespace + "/" + p.Name, Obj: p}
}

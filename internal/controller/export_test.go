package controller

// NewInformer is the informers' constructor Cache sets, for its test.
var NewInformer = newInformer

module gosplit

go 1.19

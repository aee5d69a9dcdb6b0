
    let width = params[1];
    let row = g * (256u / T) + lid / T;
    let t = lid % T;
    let live = row < params[0];
    let x0 = params[3] + row * width;
